//! Which of a batch's messages are done, by the keys their handler derives: what a Kafka
//! adapter reads, in the batch transaction, to know how far its positions may be stored.

use sqlx::PgConnection;

use crate::{HandlerKey, Idem};

impl Idem {
    /// Which of `keys` are done, as `conn` sees them: `true` for a key whose row is
    /// `success` with the key's payload fingerprint (or without one on either side),
    /// `false` for a key without a row, in progress, failed, parked or first applied with
    /// another payload. One answer per key, in order, in one statement.
    ///
    /// Each key is looked up where its handler keeps it: in its scope, and, for a handler
    /// that keeps its keys by the fact's time (`event_time`), in its fact's bucket (see
    /// [`time_buckets`](crate::time_buckets)). This is [`done_keys`](Idem::done_keys) for
    /// the keys as the generated `<handler>_key` functions give them.
    ///
    /// Pass the connection of an open transaction (a batch handler's body, say) to see the
    /// keys that transaction claimed as well as those committed before it; a plain read:
    /// no lock, no wait, no write.
    ///
    /// ```no_run
    /// # async fn f(idem: &idem_runtime::Idem, key: idem_runtime::HandlerKey) -> Result<(), sqlx::Error> {
    /// let mut tx = idem.pool().begin().await?;
    /// let done = idem.done_handler_keys(&mut tx, &[key]).await?;
    /// assert_eq!(done.len(), 1);
    /// # Ok(()) }
    /// ```
    pub async fn done_handler_keys(
        &self,
        conn: &mut PgConnection,
        keys: &[HandlerKey],
    ) -> Result<Vec<bool>, sqlx::Error> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        // One statement per layout: the keys kept by time, the others, each answer put
        // back in its key's place.
        let (timed, plain): (Vec<usize>, Vec<usize>) =
            (0..keys.len()).partition(|&index| keys[index].fact_time().is_some());
        let mut done = vec![false; keys.len()];
        for (indices, with_times) in [(timed, true), (plain, false)] {
            if indices.is_empty() {
                continue;
            }
            let scopes: Vec<String> = indices
                .iter()
                .map(|&index| keys[index].scope().to_owned())
                .collect();
            let uuids: Vec<uuid::Uuid> = indices
                .iter()
                .map(|&index| keys[index].key().as_uuid())
                .collect();
            let fingerprints: Vec<Option<Vec<u8>>> = indices
                .iter()
                .map(|&index| keys[index].fingerprint().map(|digest| digest.to_vec()))
                .collect();
            let times: Vec<_> = indices
                .iter()
                .filter_map(|&index| keys[index].fact_time())
                .collect();
            let answers = self
                .statements()
                .done_in(
                    &mut *conn,
                    &scopes,
                    &uuids,
                    &fingerprints,
                    with_times.then_some(times.as_slice()),
                )
                .await?;
            for (index, answer) in indices.into_iter().zip(answers) {
                done[index] = answer;
            }
        }
        Ok(done)
    }
}
