//! [`backend_send_checks!`](crate::backend::backend_send_checks): the compile-time check every
//! backend's `lib.rs` carries, that its public futures can be spawned on a
//! multi-threaded runtime.

/// Compile-time checks that a backend's public futures are `Send` (a non-`Send` future
/// is easy to introduce with a driver and hard to spot): expands to a `#[cfg(test)]`
/// module that type-checks `install()` of the outbox and the dedup store, `enqueue` on
/// `$conn`, `claim`, `dead_letters` and `requeue_dead`. Items after the `;` are placed in
/// the module too (with `assert_send` and the outbox traits in scope) for checks of the
/// backend's own futures.
///
/// ```
/// // In a backend's `src/lib.rs`; the module exists under `cfg(test)` only.
/// outbox_core::backend::backend_send_checks!(outbox: MyOutbox, dedup: MyDedupStore, conn: &mut MyConnection);
/// ```
#[doc(hidden)]
#[macro_export]
macro_rules! backend_send_checks {
    (outbox: $outbox:ty, dedup: $dedup:ty, conn: $conn:ty $(; $($extra:item)*)?) => {
        #[cfg(test)]
        #[allow(dead_code)]
        mod send_checks {
            use super::*;
            use $crate::{OutboxAdmin as _, OutboxStore as _};

            fn assert_send<T: Send>(_: T) {}

            fn public_futures_are_send(
                outbox: &$outbox,
                dedup: &$dedup,
                conn: $conn,
                messages: &[$crate::NewMessage],
                request: $crate::store::ClaimRequest,
                page: &$crate::DeadLetterPage,
                selection: &$crate::DeadLetterSelection,
            ) {
                assert_send(outbox.install());
                assert_send(dedup.install());
                assert_send(outbox.enqueue(conn, messages));
                assert_send(outbox.claim(request));
                assert_send(outbox.dead_letters(page));
                assert_send(outbox.requeue_dead(selection));
            }

            $($($extra)*)?
        }
    };
}
