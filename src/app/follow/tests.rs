//! The hub and the follower, tested without a database where they can be.

use super::*;

fn ev(id: Uuid, status: Status) -> Event {
    Event {
        id,
        status,
        operation: "UPDATE".into(),
        passed: false,
    }
}

#[test]
fn cancelled_shows_as_failed_with_its_stage() {
    let id = Uuid::new_v4();
    let s = RequestState::of(&Change {
        id,
        status: Status::Cancelled,
        answer: None,
        error: Some("by operator".into()),
        question: None,
    });
    assert_eq!(
        (s.status, s.stage, s.error.as_deref()),
        ("failed", Status::Cancelled, Some("cancelled: by operator"))
    );
    let s = RequestState::of(&Change {
        id,
        status: Status::Responding,
        answer: None,
        error: Some("an earlier retry".into()),
        question: None,
    });
    assert_eq!((s.status, s.error.as_deref()), ("processing", None));
    let json = serde_json::to_value(&s).unwrap_or_default();
    assert_eq!(json["stage"], "RESPONDING");
    assert!(json.get("answer").is_none());
}

#[test]
fn a_waiting_request_shows_its_question() {
    let id = Uuid::new_v4();
    let s = RequestState::of(&Change {
        id,
        status: Status::WaitingUserInput,
        answer: None,
        error: None,
        question: Some("Which trip?".into()),
    });
    assert_eq!(
        (s.status, s.stage, s.question.as_deref()),
        ("waiting_user_input", Status::WaitingUserInput, Some("Which trip?"))
    );
    assert!(!s.is_terminal());
    let s = RequestState::of(&Change {
        id,
        status: Status::AwaitingReview,
        answer: None,
        error: None,
        question: Some("stale".into()),
    });
    assert_eq!((s.status, s.question), ("awaiting_review", None));
}

#[tokio::test]
async fn a_full_subscriber_is_marked_lagged_and_never_blocks_the_hub() {
    let hub = Hub::new();
    let id = Uuid::new_v4();
    let sub = hub.subscribe(Target::Request(id), 2);
    let mut users = HashMap::new();
    let events: Vec<Event> = (0..100).map(|_| ev(id, Status::Analyzing)).collect();
    assert!(
        hub.plan(&events, &users).is_empty(),
        "no lookup for non-terminal events"
    );
    hub.deliver(&events, &HashMap::new(), &mut users);
    assert!(sub.take_lagged());
    assert!(!sub.take_lagged());
    assert_eq!(hub.counts(), (1, 0));
    drop(sub);
    assert_eq!(hub.counts(), (0, 0));
}

#[tokio::test]
async fn terminal_events_carry_the_row_and_reach_user_subscribers() {
    let hub = Hub::new();
    let (id, user) = (Uuid::new_v4(), Uuid::new_v4());
    let mut by_user = hub.subscribe(Target::User(user), 8);
    let mut by_req = hub.subscribe(Target::Request(id), 8);
    let mut users = HashMap::new();
    let events = [ev(id, Status::Analyzed), ev(id, Status::Completed)];
    assert_eq!(hub.plan(&events, &users), vec![id], "user unknown: one lookup");
    let row = RequestStatus {
        id,
        user_id: user,
        status: Status::Completed,
        answer: Some("42".into()),
        error: None,
        question: None,
    };
    hub.deliver(&events, &HashMap::from([(id, row)]), &mut users);
    for sub in [&mut by_user, &mut by_req] {
        let Some(Push::Change(a)) = sub.recv().await else {
            panic!("first push")
        };
        assert_eq!(a.status, Status::Analyzed);
        let Some(Push::Change(b)) = sub.recv().await else {
            panic!("second push")
        };
        assert_eq!((b.status, b.answer.as_deref()), (Status::Completed, Some("42")));
    }
    assert!(users.is_empty(), "a terminal request leaves the cache");
}
