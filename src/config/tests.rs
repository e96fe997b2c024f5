use super::*;

#[allow(clippy::result_large_err, reason = "figment's test jail fixes the error type")]
fn load(toml: Option<&str>, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let mut out = None;
    figment::Jail::expect_with(|jail| {
        jail.clear_env();
        for (k, v) in vars {
            jail.set_env(k, v);
        }
        if let Some(body) = toml {
            jail.create_file("maas.toml", body)?;
        }
        out = Some(Config::load(toml.map(|_| Path::new("maas.toml"))));
        Ok(())
    });
    out.unwrap_or_else(|| {
        Err(ConfigError::Invalid {
            key: "test",
            problem: "jail did not run".into(),
        })
    })
}

/// The error of loading with a database URL and `var=value`; empty when it loads.
fn refused(var: &str, value: &str) -> String {
    load(None, &[("DATABASE_URL", "postgres://u@h/db"), (var, value)])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
}

#[test]
fn defaults_then_file_then_environment() {
    let cfg = load(
        Some("lease_secs = 7\nsweep_secs = 9\n[concurrency]\nrespond = 3\n"),
        &[
            ("DATABASE_URL", "postgres://u@localhost/db"),
            ("MAAS_SWEEP_SECS", "2"),
            ("MAAS_HTTP_ADDR", "127.0.0.1:0"),
            ("MAAS_CONCURRENCY__ANALYZE", "5"),
        ],
    );
    let cfg = match cfg {
        Ok(c) => c,
        Err(e) => panic!("load failed: {e}"),
    };
    assert_eq!(cfg.lease_secs, 7);
    assert_eq!(cfg.sweep_secs, 2, "environment overrides the file");
    assert_eq!(cfg.http_addr, "127.0.0.1:0");
    assert_eq!(cfg.concurrency.respond, 3);
    assert_eq!(cfg.concurrency.analyze, 5);
    assert_eq!(cfg.concurrency.assemble, 256);
    assert_eq!(cfg.llm_provider, "offline");
    assert_eq!(cfg.database_url.expose(), "postgres://u@localhost/db");
}

#[test]
fn http_addresses_parse_and_loopback_is_recognised() {
    let err = refused("MAAS_HTTP_ADDR", "nowhere");
    assert!(err.contains("http_addr"), "{err}");
    // Whether an address may be bound without tokens is decided at bind.
    for ok in ["127.0.0.1:0", ":0", "[::1]:8080", "localhost:8080", "0.0.0.0:8080"] {
        let cfg = load(None, &[("DATABASE_URL", "postgres://u@h/db"), ("MAAS_HTTP_ADDR", ok)]);
        assert!(cfg.is_ok(), "{ok}: {:?}", cfg.err().map(|e| e.to_string()));
    }
}

#[test]
fn a_bad_value_is_refused_by_name() {
    let err = refused("MAAS_LEASE_SECS", "0");
    assert!(err.contains("lease_secs"), "{err}");
    let err = refused("MAAS_LEASE_SECS", "soon");
    assert!(err.to_lowercase().contains("lease_secs"), "{err}");
    let err = load(None, &[]).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("DATABASE_URL"), "{err}");
}

#[test]
fn a_bad_value_of_a_secret_key_is_not_echoed() {
    for (var, value) in [
        ("MAAS_CALLBACKS__SECRET", "987654321"),
        ("MAAS_CALLBACKS__SECRET", "[\"s3cr3t-in-a-list\"]"),
        ("MAAS_LISTEN_DATABASE_URL", "{ pw = \"hunter2-url\" }"),
        ("MAAS_API_TOKENS", "{ t = \"tok-in-a-table\" }"),
        ("MAAS_LLM__OPENAI__API_KEY", "[\"sk-in-a-list\"]"),
    ] {
        let err = refused(var, value);
        assert!(!err.is_empty(), "{var}={value} loaded");
        for secret in ["987654321", "s3cr3t", "hunter2", "tok-in-a-table", "sk-in-a-list"] {
            assert!(!err.contains(secret), "{var}: {err}");
        }
        assert!(err.contains("not shown"), "{var}: {err}");
    }
    let err = refused("MAAS_LEASE_SECS", "soon");
    assert!(err.contains("soon"), "other values are still shown: {err}");
}

#[test]
fn api_tokens_from_a_list_or_a_comma_separated_string() {
    let cfg = load(
        Some("api_tokens = [\"a1\", \" b2 \"]\n"),
        &[("DATABASE_URL", "postgres://u@h/db")],
    )
    .map_err(|e| e.to_string());
    let shown: Vec<String> = cfg
        .map(|c| c.api_tokens.iter().map(|t| t.expose().to_owned()).collect())
        .unwrap_or_default();
    assert_eq!(shown, ["a1", "b2"]);
    let cfg = load(
        None,
        &[
            ("DATABASE_URL", "postgres://u@h/db"),
            ("MAAS_API_TOKENS", "tok1, tok2,,"),
            ("MAAS_HTTP_ADDR", "0.0.0.0:0"),
        ],
    )
    .map_err(|e| e.to_string());
    let shown: Vec<String> = cfg
        .map(|c| c.api_tokens.iter().map(|t| t.expose().to_owned()).collect())
        .unwrap_or_default();
    assert_eq!(shown, ["tok1", "tok2"]);
}

#[test]
fn the_archivist_section_loads_and_is_validated() {
    let cfg = load(
        Some("[archivist]\nmin_pending = 5\nschedule = \"0 */10 * * * *\"\n"),
        &[
            ("DATABASE_URL", "postgres://u@h/db"),
            ("MAAS_ARCHIVIST__COOLDOWN_SECS", "60"),
        ],
    );
    let cfg = match cfg {
        Ok(c) => c,
        Err(e) => panic!("load failed: {e}"),
    };
    assert_eq!(cfg.archivist.min_pending, 5);
    assert_eq!(cfg.archivist.cooldown_secs, 60);
    assert_eq!(cfg.archivist.schedule, "0 */10 * * * *");
    assert_eq!(cfg.archivist.max_pending_age_secs, 86_400, "default");
    for bad in ["0 */6 * * *", "0 0 */6 * * * *", "every six hours x y z"] {
        let err = refused("MAAS_ARCHIVIST__SCHEDULE", bad);
        assert!(err.contains("archivist.schedule"), "{bad}: {err}");
    }
}

#[test]
fn secrets_are_redacted() {
    let cfg = Config {
        database_url: Secret("postgres://u:hunter2@h/db".into()),
        api_tokens: vec![Secret("tok-hunter3".into())],
        callbacks: CallbacksConfig {
            secret: Secret("callback-key-42".into()),
            ..CallbacksConfig::default()
        },
        ..Config::default()
    };
    let shown = format!("{cfg:?}");
    assert!(!shown.contains("hunter2") && !shown.contains("hunter3"), "{shown}");
    assert!(!shown.contains("callback-key-42"), "{shown}");
}

#[test]
fn ops_settings_load_from_the_environment_and_are_validated() {
    let cfg = load(
        None,
        &[
            ("DATABASE_URL", "postgres://u@h/db"),
            ("MAAS_CALLBACKS__SECRET", "s3"),
            ("MAAS_CALLBACKS__POLL_SECS", "1"),
            ("MAAS_RETENTION__KEEP_DAYS", "0"),
        ],
    );
    let cfg = match cfg {
        Ok(c) => c,
        Err(e) => panic!("load failed: {e}"),
    };
    assert_eq!(cfg.callbacks.secret.expose(), "s3");
    assert_eq!(cfg.callbacks.poll_secs, 1);
    assert_eq!(cfg.callbacks.max_attempts, 12);
    assert_eq!(cfg.retention.keep(), None, "0 keeps everything");
    assert_eq!(
        RetentionConfig::default().keep(),
        Some(Duration::from_secs(30 * 86_400))
    );
    let err = refused("MAAS_RETENTION__BATCH", "0");
    assert!(err.contains("retention.batch"), "{err}");
}

#[test]
fn retry_delay_grows_and_is_capped() {
    let cfg = Config {
        retry_base_ms: 1000,
        retry_max_secs: 5,
        ..Config::default()
    };
    let d1 = cfg.retry_delay(1);
    assert!(
        d1 >= Duration::from_millis(500) && d1 <= Duration::from_secs(1),
        "{d1:?}"
    );
    let d3 = cfg.retry_delay(3);
    assert!(d3 >= Duration::from_secs(2) && d3 <= Duration::from_secs(4), "{d3:?}");
    let d30 = cfg.retry_delay(30);
    assert!(d30 <= Duration::from_secs(5), "{d30:?}");
}
