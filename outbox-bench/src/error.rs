//! The benches' error plumbing.

/// An error from any layer; a bench reports it and exits non-zero.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The result type of the benches that mix the library's, sqlx's and the OS's errors.
pub type Res<T> = Result<T, BoxError>;

/// A sqlx error of the bench's own statements (loading, counting, dropping) as an
/// [`outbox_core::Error`] of kind `Storage`, for the benches that return
/// `outbox_core::Result`.
pub fn storage(e: sqlx::Error) -> outbox_core::Error {
    outbox_core::Error::new(outbox_core::ErrorKind::Storage, "bench plumbing").with_source(e)
}
