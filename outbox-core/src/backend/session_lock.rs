//! [`SessionLockGuard`]: the guard of a lock that lives exactly as long as a database
//! session (PostgreSQL advisory locks, SQL Server application locks, MySQL `GET_LOCK`),
//! written once: release on unlock, and end the session, never pool it, whenever the
//! release did not happen or did not work.

use std::fmt;

use async_trait::async_trait;

use crate::error::Result;
use crate::lock::LockGuard;
use crate::names::LockName;

/// The database session a [`SessionLockGuard`] holds its lock on: a connection of its
/// own, whose end frees every lock the session holds.
#[async_trait]
pub trait LockSession: Send + Sync + fmt::Debug + 'static {
    /// Release `name` on this session: `true` when the session held it and now does
    /// not. On `false` or an error the guard ends the session instead.
    ///
    /// # Errors
    /// The statement failed; the lock may still be held.
    async fn release(&mut self, name: &LockName) -> Result<bool>;

    /// End the session (close the connection; never hand it to other pool users), which
    /// makes the server free every lock it still holds.
    fn end(self);
}

/// A held lock on a [`LockSession`]:
///
/// - [`unlock`](LockGuard::unlock) releases the lock, then drops the session (a pooled
///   connection goes back to its pool); when the release fails or finds the lock not
///   held, the session is ended instead, and a failure is returned;
/// - dropping the guard without unlocking ends the session, so the server frees the
///   lock and no other pool user ever gets a lock-holding connection.
///
/// A backend's `try_lock` builds the guard around the session *before* it runs the
/// lock statement ([`session_mut`](Self::session_mut)), so that a future dropped
/// mid-statement ends the session too, and gives a refused session back with
/// [`into_session`](Self::into_session).
pub struct SessionLockGuard<S: LockSession> {
    name: LockName,
    session: Option<S>,
}

impl<S: LockSession> SessionLockGuard<S> {
    /// The guard of `name` on `session`.
    pub fn new(name: LockName, session: S) -> Self {
        SessionLockGuard {
            name,
            session: Some(session),
        }
    }

    /// The session, to run the lock statement on.
    pub fn session_mut(&mut self) -> &mut S {
        self.session
            .as_mut()
            .expect("a guard holds its session until it ends")
    }

    /// The session back, without ending it: for a lock that was not taken.
    pub fn into_session(mut self) -> S {
        self.session
            .take()
            .expect("a guard holds its session until it ends")
    }
}

impl<S: LockSession> fmt::Debug for SessionLockGuard<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionLockGuard")
            .field("name", &self.name)
            .field("session", &self.session)
            .finish()
    }
}

#[async_trait]
impl<S: LockSession> LockGuard for SessionLockGuard<S> {
    fn name(&self) -> &LockName {
        &self.name
    }

    async fn unlock(mut self: Box<Self>) -> Result<()> {
        let Some(mut session) = self.session.take() else {
            return Ok(());
        };
        match session.release(&self.name).await {
            Ok(true) => Ok(()),
            Ok(false) => {
                tracing::warn!(name = %self.name, "lock not held by its session at unlock; ending the session");
                session.end();
                Ok(())
            }
            Err(err) => {
                // The lock may still be held: end the session rather than pool it.
                session.end();
                Err(err)
            }
        }
    }
}

impl<S: LockSession> Drop for SessionLockGuard<S> {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            tracing::debug!(name = %self.name, "lock guard dropped; ending its session");
            session.end();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use std::sync::{Arc, Mutex};

    /// What happened to a session: released, ended, or dropped (pooled).
    #[derive(Debug, Default)]
    struct Log(Mutex<Vec<&'static str>>);

    #[derive(Debug)]
    struct Session {
        answer: Option<bool>,
        log: Arc<Log>,
        ended: bool,
    }

    impl Session {
        fn new(answer: Option<bool>, log: &Arc<Log>) -> Self {
            Session {
                answer,
                log: Arc::clone(log),
                ended: false,
            }
        }
    }

    #[async_trait]
    impl LockSession for Session {
        async fn release(&mut self, _: &LockName) -> Result<bool> {
            self.log.0.lock().unwrap().push("release");
            self.answer
                .ok_or_else(|| Error::invalid_input("release failed"))
        }

        fn end(mut self) {
            self.ended = true;
            self.log.0.lock().unwrap().push("end");
        }
    }

    impl Drop for Session {
        fn drop(&mut self) {
            if !self.ended {
                self.log.0.lock().unwrap().push("pooled");
            }
        }
    }

    fn held(answer: Option<bool>) -> (Box<SessionLockGuard<Session>>, Arc<Log>) {
        let log = Arc::new(Log::default());
        let name = LockName::new("purge").unwrap();
        let guard = Box::new(SessionLockGuard::new(name, Session::new(answer, &log)));
        (guard, log)
    }

    fn seen(log: &Log) -> Vec<&'static str> {
        log.0.lock().unwrap().clone()
    }

    #[tokio::test]
    async fn unlock_releases_and_pools_the_session() {
        let (guard, log) = held(Some(true));
        assert_eq!(guard.name().as_str(), "purge");
        guard.unlock().await.unwrap();
        assert_eq!(seen(&log), ["release", "pooled"]);
    }

    #[tokio::test]
    async fn a_lock_not_held_at_unlock_ends_the_session() {
        let (guard, log) = held(Some(false));
        guard.unlock().await.unwrap();
        assert_eq!(seen(&log), ["release", "end"]);
    }

    #[tokio::test]
    async fn a_failed_release_ends_the_session_and_is_returned() {
        let (guard, log) = held(None);
        let err = guard.unlock().await.unwrap_err();
        assert_eq!(err.message(), "release failed");
        assert_eq!(seen(&log), ["release", "end"]);
    }

    #[test]
    fn a_dropped_guard_ends_its_session_and_a_refused_one_gives_it_back() {
        let (guard, log) = held(Some(true));
        drop(guard);
        assert_eq!(seen(&log), ["end"]);

        let (mut guard, log) = held(Some(true));
        assert!(!guard.session_mut().ended);
        assert!(format!("{guard:?}").contains("purge"));
        drop(guard.into_session());
        assert_eq!(seen(&log), ["pooled"]);
    }
}
