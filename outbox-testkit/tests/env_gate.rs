//! `service_url` skips visibly, or fails under `OUTBOX_REQUIRE_INTEGRATION=1`.
//!
//! One test in its own binary: it changes process environment variables.

use outbox_testkit::service_url;

#[test]
fn missing_service_skips_or_fails_as_required() {
    const VAR: &str = "OUTBOX_TESTKIT_GATE_PROBE_URL";
    std::env::remove_var(VAR);

    std::env::set_var("OUTBOX_REQUIRE_INTEGRATION", "0");
    assert_eq!(service_url(VAR, "probe"), None, "a missing URL skips");

    std::env::set_var(VAR, "db://somewhere");
    assert_eq!(service_url(VAR, "probe").as_deref(), Some("db://somewhere"));
    std::env::set_var(VAR, "  ");
    assert_eq!(
        service_url(VAR, "probe"),
        None,
        "a blank URL counts as missing"
    );

    std::env::set_var("OUTBOX_REQUIRE_INTEGRATION", "1");
    let required = std::panic::catch_unwind(|| service_url(VAR, "probe"));
    assert!(
        required.is_err(),
        "with integration required a missing URL must fail"
    );
    std::env::remove_var(VAR);
}
