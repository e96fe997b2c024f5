//! What `finish.sql` is given for each way a stage attempt ends.

use super::super::params_check::check;
use super::*;

#[test]
fn finish_params_are_in_the_order_the_sql_documents() {
    check(FINISH, FinishParams::NAMES);
}

fn claimed() -> Claimed {
    Claimed {
        id: Uuid::nil(),
        user_id: Uuid::nil(),
        thread_id: None,
        user_query: String::new(),
        attempt: 2,
        lease_token: 7,
        analysis: None,
        context: None,
        debug: false,
        tenant_id: Uuid::nil(),
        stream: false,
        review: false,
        claimed_at: Utc::now(),
        due_for: Duration::ZERO,
        memory: Vec::new(),
        earlier_turns: 0,
        clarify: crate::model::Clarify::Off,
    }
}

/// An analysis with its assemble and respond stages fused.
fn fused_analysis() -> Finished {
    let usage = StepUsage {
        model: Some("m".into()),
        ..StepUsage::default()
    };
    let analysis = serde_json::json!({"needs_context": true});
    let mut f = Finished::succeeded(&claimed(), Output::Analysis { analysis, fused: None }, usage, Some(5));
    f.fuse(FusedAssemble {
        context: "the context".into(),
        context_sources: Some(serde_json::json!([])),
        tokens: Some(12),
        latency_ms: 1,
        respond: Some(FusedRespond {
            answer: "the answer".into(),
            model: Some("r".into()),
            prompt_tokens: Some(30),
            completion_tokens: Some(7),
            latency_ms: 2,
        }),
    });
    f
}

#[test]
fn a_fused_success_binds_its_output_and_its_fused_stages() {
    let batch = [fused_analysis()];
    let p = FinishParams::new("w", &batch, |_| None, Duration::from_secs(30));
    assert_eq!(
        (p.stage[0], p.outcome[0], p.new_status[0]),
        (StageKind::Analyze, Outcome::Succeeded, Status::Analyzed)
    );
    assert_eq!((p.token[0], p.attempt[0], p.delay_ms[0]), (7, 2, 0));
    assert!(p.analysis[0].is_some());
    assert_eq!(p.context[0], Some("the context"));
    assert!(p.context_sources[0].is_some());
    assert_eq!((p.answer[0], p.error_class[0], p.error_message[0]), (None, None, None));
    assert_eq!(
        (p.fused_in[0], p.fused_tokens[0], p.fused_latency_ms[0]),
        (true, Some(12), Some(1))
    );
    assert_eq!((p.fused_answer[0], p.fused_model[0]), (Some("the answer"), Some("r")));
    assert_eq!(batch[0].next_stage(), None);
}

#[test]
fn a_result_failed_instead_binds_no_output_and_keeps_its_usage() {
    let mut f = fused_analysis();
    assert!(f.drop_fused_respond());
    assert_eq!(f.next_stage(), Some(StageKind::Respond));
    f.fail_instead(Unsuccessful {
        outcome: Outcome::Failed,
        new_status: Status::Failed,
        delay: Duration::ZERO,
        error_class: "unwritable_result".into(),
        error_message: "refused".into(),
    });
    assert!(!f.drop_fused_respond());
    let batch = [f];
    let p = FinishParams::new("w", &batch, |_| None, Duration::from_secs(30));
    assert_eq!((p.outcome[0], p.new_status[0]), (Outcome::Failed, Status::Failed));
    assert_eq!((p.analysis[0], p.context[0], p.context_sources[0]), (None, None, None));
    assert_eq!((p.fused_in[0], p.fused_answer[0]), (false, None));
    assert_eq!(
        (p.error_class[0], p.error_message[0]),
        (Some("unwritable_result"), Some("refused"))
    );
    assert_eq!(p.model[0], Some("m"));
}
