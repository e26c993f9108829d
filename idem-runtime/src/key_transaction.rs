//! The transaction that holds a claimed key: the connection a handler's body writes
//! through, and how that transaction begins and ends.
//!
//! idem begins, commits and rolls back this transaction with its own statements rather
//! than through sqlx's `Transaction`, so that the commit's check travels in the commit's
//! own round trip and nothing follows it: sqlx's guard would roll back, with one more
//! statement per message, a transaction that it did not see committed. The guard's other
//! duty is kept here: a transaction that is dropped open (a delivery cancelled at any
//! await point, a panic) is rolled back before its connection can serve anyone else.

use std::ops::{Deref, DerefMut};

use sqlx::pool::PoolConnection;
use sqlx::{Connection, Executor, PgConnection, PgPool, Postgres};

/// The open transaction that holds a delivery's claimed key, handed to the body of a
/// transactional handler (see [`run_transactional`](crate::transactional::run_transactional())). It
/// dereferences to the [`PgConnection`] that the body's statements go through; the body's
/// writes commit together with the key's `success`.
///
/// The runtime alone ends this transaction. A body that runs `COMMIT` or `ROLLBACK` on
/// the connection, or begins a transaction of its own on it (`tx.begin()`: the connection
/// is already inside idem's transaction, so sqlx's nested transaction would end it), gets
/// [`Error::TransactionEnded`](crate::Error::TransactionEnded) and its key is parked. For a
/// part of the body that may fail on its own, use `SAVEPOINT` and `ROLLBACK TO SAVEPOINT`
/// statements. The commit's check sees a transaction that is over or aborted, not one that
/// the body began after ending idem's: `ROLLBACK` then `BEGIN`, or `ROLLBACK AND CHAIN`,
/// leave the claim gone and the rest of the effects committed without it (run again by the
/// next delivery); `COMMIT AND CHAIN` commits the key with the effects so far, and a later
/// failure of the body loses the rest.
///
/// Dropping it (a cancelled delivery, a panic in the body) rolls the transaction back
/// before the connection returns to the pool.
pub struct KeyTransaction {
    /// `None` once the transaction has ended and the connection went back to the pool.
    connection: Option<PoolConnection<Postgres>>,
    /// Behind a transaction pooler: the statements that sqlx prepared and cached on the
    /// connection are closed before the transaction ends (see [`close_cached_statements`]).
    pooled: bool,
}

impl KeyTransaction {
    /// Acquires a connection from `pool` and opens a transaction on it with `begin` (one
    /// simple query: `BEGIN` and the transaction's settings).
    ///
    /// Cancel-safe: dropped while `begin` is in flight, the transaction it opens is rolled
    /// back before the connection is reused. `pooled`: the pool reaches PostgreSQL through
    /// a transaction pooler.
    pub(crate) async fn begin(
        pool: &PgPool,
        begin: &str,
        pooled: bool,
    ) -> Result<Self, sqlx::Error> {
        let connection = pool.acquire().await?;
        let mut transaction = KeyTransaction {
            connection: Some(connection),
            pooled,
        };
        if pooled {
            // Statements cached by the pool's other users name nothing on the server
            // connection that this transaction gets.
            close_cached_statements(transaction.connection()).await?;
        }
        transaction.execute(begin).await?;
        Ok(transaction)
    }

    /// Sends `statements` (a simple query that ends with `COMMIT`) and hands the
    /// connection back to the pool. On an error the transaction is rolled back, unless
    /// the server reports that none is open any more.
    pub(crate) async fn commit(mut self, statements: &str) -> Result<(), sqlx::Error> {
        if self.pooled
            && let Err(error) = close_cached_statements(self.connection()).await
        {
            let _ = self.end("ROLLBACK").await;
            return Err(error);
        }
        match self.execute(statements).await {
            Ok(_) => {
                self.release();
                Ok(())
            }
            Err(error) => {
                if is_no_transaction(&error) {
                    self.release();
                } else {
                    let _ = self.end("ROLLBACK").await;
                }
                Err(error)
            }
        }
    }

    /// Rolls the transaction back and hands the connection back to the pool. An error
    /// tells that the connection is lost (it is then closed, not reused).
    pub(crate) async fn rollback(mut self) -> Result<(), sqlx::Error> {
        self.end("ROLLBACK").await
    }

    /// Rolls the transaction back after a body that failed, as [`rollback`](Self::rollback)
    /// does, and tells whether the body had ended it itself (`COMMIT`, `ROLLBACK`, or
    /// sqlx's `begin()` on the connection): what the body ran after that was committed on
    /// its own, so the delivery must not run again. The check travels in the rollback's
    /// round trip (a `SAVEPOINT` fails with 25P01 outside a transaction); a transaction
    /// the body left aborted takes a second round trip to roll back.
    pub(crate) async fn rollback_after_failure(mut self) -> Result<Ended, sqlx::Error> {
        let closed = match self.pooled {
            true => close_cached_statements(self.connection()).await,
            false => Ok(()),
        };
        match closed.and(
            self.execute("SAVEPOINT idem_rollback_check; ROLLBACK")
                .await,
        ) {
            Ok(()) => {
                self.release();
                Ok(Ended::ByRollback)
            }
            Err(error) if is_no_transaction(&error) => {
                self.release();
                Ok(Ended::ByBody)
            }
            // Aborted by a statement of the body: the check could not run.
            Err(error) if error.as_database_error().is_some() => {
                self.end("ROLLBACK").await.map(|()| Ended::ByRollback)
            }
            Err(error) => {
                if let Some(mut connection) = self.connection.take() {
                    connection.close_on_drop();
                }
                Err(error)
            }
        }
    }

    async fn end(&mut self, statement: &str) -> Result<(), sqlx::Error> {
        let closed = match self.pooled {
            true => close_cached_statements(self.connection()).await,
            false => Ok(()),
        };
        match closed.and(self.execute(statement).await.map(drop)) {
            Ok(_) => {
                self.release();
                Ok(())
            }
            Err(error) => {
                if let Some(mut connection) = self.connection.take() {
                    connection.close_on_drop();
                }
                Err(error)
            }
        }
    }

    /// The transaction is over: the connection goes back to the pool.
    fn release(&mut self) {
        self.connection = None;
    }

    fn connection(&mut self) -> &mut PgConnection {
        self.connection
            .as_deref_mut()
            .expect("a KeyTransaction is used only while its transaction is open")
    }

    async fn execute(&mut self, statements: &str) -> Result<(), sqlx::Error> {
        self.connection().execute(statements).await.map(drop)
    }
}

/// How a failed body's transaction ended (see [`KeyTransaction::rollback_after_failure`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Rolled back by the runtime: nothing of the body stays.
    ByRollback,
    /// The body had ended it itself; what it ran afterwards may be committed.
    ByBody,
}

impl Deref for KeyTransaction {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.connection
            .as_deref()
            .expect("a KeyTransaction is used only while its transaction is open")
    }
}

impl DerefMut for KeyTransaction {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.connection()
    }
}

impl Drop for KeyTransaction {
    /// Rolls an open transaction back in a task of its own, which then hands the
    /// connection back to the pool. Without a runtime to run that task, the connection is
    /// closed instead, and the server rolls the transaction back.
    fn drop(&mut self) {
        let Some(mut connection) = self.connection.take() else {
            return;
        };
        let pooled = self.pooled;
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    // Waits for whatever the dropped delivery left in flight, then ends
                    // the transaction; a connection that cannot is closed.
                    let closed = match pooled {
                        true => close_cached_statements(&mut connection).await,
                        false => Ok(()),
                    };
                    if closed.is_err() || connection.execute("ROLLBACK").await.is_err() {
                        connection.close_on_drop();
                    }
                });
            }
            Err(_) => connection.close_on_drop(),
        }
    }
}

impl std::fmt::Debug for KeyTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyTransaction")
            .field("open", &self.connection.is_some())
            .finish()
    }
}

/// Closes the statements that sqlx prepared and cached on `connection`, if any.
///
/// Behind a transaction pooler, a prepared statement stays on the server connection that
/// the transaction ran on, and the next transaction of this client may run on another: a
/// statement that sqlx would take from its cache there is missing, or is another client's
/// of the same name. Closed while the transaction still holds its server connection, they
/// leave nothing behind (PostgreSQL accepts `Close` in an aborted transaction too). A
/// handler whose queries are not prepared for reuse (`.persistent(false)`) caches nothing,
/// and this costs nothing; otherwise one round trip, of which a warning tells once.
async fn close_cached_statements(connection: &mut PgConnection) -> Result<(), sqlx::Error> {
    use std::sync::atomic::{AtomicBool, Ordering};
    static WARNED: AtomicBool = AtomicBool::new(false);
    if connection.cached_statements_size() == 0 {
        return Ok(());
    }
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            statements = connection.cached_statements_size(),
            "idem: behind a transaction pooler, the statements that sqlx caches on a connection are closed before each handler transaction ends (a round trip per message); write the handler's queries with `.persistent(false)` to save it"
        );
    }
    connection.clear_cached_statements().await
}

/// Whether the server refused a statement because no transaction is open (SQLSTATE
/// 25P01): the body ended idem's transaction itself.
pub(crate) fn is_no_transaction(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .is_some_and(|db| db.code().as_deref() == Some("25P01"))
}
