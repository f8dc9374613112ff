//! `service_test!`: a crate's own tests that need its service, each with the runtime,
//! the `ignore` attribute and the fixture written once.

/// Writes tests that need a service (a database, a broker, a private cluster): each
/// gets its `#[tokio::test]`, `#[cfg_attr(outbox_service_unset, ignore = "<reason>")]`
/// and a first statement that awaits its fixture, skipping the test when the fixture
/// yields `None`.
///
/// ```text
/// service_test! {
///     ignore = "<reason>";            // required: what cargo shows for an ignored test
///     flavor = multi_thread(2);       // optional: current_thread (the default),
///                                     // multi_thread, or multi_thread(<workers>)
///
///     /// What the test proves.
///     #[other_attributes]
///     async fn name(<pattern> = <fixture>) {
///         // the body, with the pattern's bindings in scope
///     }
///     // more tests
/// }
/// ```
///
/// The settings come first, each ended by `;`, in any order; when one is given twice
/// the last wins, so a crate-local wrapper can fix them and a call can still change the
/// flavor. Each test is doc comments and attributes (kept), `async fn`, its name, and
/// in the parentheses a pattern, `=`, and the fixture: an expression of a future whose
/// output is `Option<T>`. The test awaits it first; `None` ends the test, which then
/// passes, so the fixture must say why it gave none: [`service_url`](crate::service_url)
/// prints a `SKIPPED` line (or panics under `OUTBOX_REQUIRE_INTEGRATION=1`). `Some(t)`
/// is matched against the pattern (`f`, `(pool, outbox)`, `Env { pool, .. }`).
///
/// A test expands to
///
/// ```text
/// /// What the test proves.
/// #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
/// #[cfg_attr(outbox_service_unset, ignore = "<reason>")]
/// async fn name() {
///     let Some(<pattern>) = <fixture>.await else {
///         return;
///     };
///     // the body
/// }
/// ```
///
/// `outbox_service_unset` is the cfg the crate's build script sets, through
/// `outbox-build`, when the service was missing at build time, so cargo's summary
/// counts these tests as ignored, with the reason, instead of as passed. The calling
/// crate needs that build script and `tokio` as a dev-dependency with the `macros`
/// feature (and `rt-multi-thread` for `multi_thread`).
///
/// Give the reason and the flavor once per crate, in a wrapper in its `tests/common`
/// module, and write the tests with the wrapper:
///
/// ```no_run
/// // tests/common/mod.rs
/// /// The URL of the test database, or `None` after a visible `SKIPPED` line.
/// pub async fn database(what: &str) -> Option<String> {
///     outbox_testkit::service_url("OUTBOX_MYDB_URL", what)
/// }
///
/// /// `service_test!` with this crate's reason and flavor.
/// macro_rules! mydb_test {
///     ($($tests:tt)*) => {
///         outbox_testkit::service_test! {
///             ignore = "OUTBOX_MYDB_URL was not set when these tests were built";
///             flavor = multi_thread(2);
///             $($tests)*
///         }
///     };
/// }
///
/// // tests/engine.rs
/// mydb_test! {
///     /// Claims skip rows another transaction locked.
///     async fn claims_skip_locked_rows(url = database("locked rows")) {
///         assert!(url.starts_with("mydb://"));
///     }
///
///     /// Installing twice changes nothing.
///     async fn install_is_idempotent(_url = database("install")) {}
/// }
///
/// mydb_test! {
///     flavor = current_thread;
///
///     /// A test whose fixture makes two things.
///     async fn two_of_them((a, b) = async { Some((1, 2)) }) {
///         assert_eq!(a + b, 3);
///     }
/// }
/// # fn main() {}
/// ```
///
/// A crate whose tests live in several modules exports the wrapper from its common
/// module (`pub(crate) use mydb_test;`) and calls it by path (`common::mydb_test!`),
/// or declares that module first, with `#[macro_use]`.
#[macro_export]
macro_rules! service_test {
    ($($input:tt)*) => {
        $crate::__service_test!(@settings [] [[::tokio::test]] $($input)*);
    };
}

/// [`service_test!`]'s settings and expansion.
#[doc(hidden)]
#[macro_export]
macro_rules! __service_test {
    (@settings [$($reason:literal)?] [$test:tt] ignore = $new:literal; $($rest:tt)*) => {
        $crate::__service_test!(@settings [$new] [$test] $($rest)*);
    };
    (@settings [$($reason:literal)?] [$test:tt] flavor = current_thread; $($rest:tt)*) => {
        $crate::__service_test!(@settings [$($reason)?] [[::tokio::test]] $($rest)*);
    };
    (@settings [$($reason:literal)?] [$test:tt] flavor = multi_thread; $($rest:tt)*) => {
        $crate::__service_test!(
            @settings [$($reason)?] [[::tokio::test(flavor = "multi_thread")]] $($rest)*
        );
    };
    (
        @settings [$($reason:literal)?] [$test:tt]
        flavor = multi_thread($workers:tt); $($rest:tt)*
    ) => {
        $crate::__service_test!(
            @settings [$($reason)?]
            [[::tokio::test(flavor = "multi_thread", worker_threads = $workers)]]
            $($rest)*
        );
    };
    (@settings [$($reason:literal)?] [$test:tt] flavor = $($rest:tt)*) => {
        ::core::compile_error!(
            "service_test!: the flavor is `current_thread`, `multi_thread` or \
             `multi_thread(<workers>)`, followed by `;`"
        );
    };
    (@settings [] [$test:tt] $($rest:tt)*) => {
        ::core::compile_error!(
            "service_test!: start with `ignore = \"<reason>\";`, the reason cargo shows \
             for the tests when the service was missing at build time"
        );
    };
    (
        @settings [$reason:literal] [$test:tt]
        $(
            $(#[$attr:meta])*
            async fn $name:ident($fixture:pat = $make:expr) { $($body:tt)* }
        )*
    ) => {
        $(
            $(#[$attr])*
            #$test
            #[cfg_attr(outbox_service_unset, ignore = $reason)]
            async fn $name() {
                let Some($fixture) = $make.await else {
                    return;
                };
                $($body)*
            }
        )*
    };
}
