//! The build script's gate (`outbox-build`) matches the environment these tests were
//! built in: the cfg that builds the NATS tests as ignored is set exactly when
//! `OUTBOX_NATS_URL` was unset or blank. A gate that printed nothing (so the tests
//! would run, and fail, without the service) fails here in a build without the URL.

#[test]
fn the_service_tests_are_ignored_exactly_when_the_url_was_missing_at_build() {
    let url = option_env!("OUTBOX_NATS_URL");
    let missing = url.is_none_or(|u| u.trim().is_empty());
    assert_eq!(
        cfg!(outbox_service_unset),
        missing,
        "built with OUTBOX_NATS_URL={url:?}: the gate's cfg disagrees"
    );
}
