//! The records a handler's body sent, waiting for its commit.

use idem_runtime::AtCommit;

use super::relay;
use crate::schema::Schema;
use crate::store::outbox::{Insert, insert_statement};

/// The records of one delivery's body, by outbox, in the order they were sent: written by
/// the body's commit, one write per outbox that takes its locks first, in one order.
#[derive(Debug, Default)]
pub(crate) struct PendingRecords {
    outboxes: Vec<(Schema, Vec<Insert>, bool)>,
}

impl PendingRecords {
    /// Adds `rows` for `schema`'s outbox; `wake`: the commit also notifies its relays.
    pub(crate) fn add(&mut self, schema: &Schema, rows: Vec<Insert>, wake: bool) {
        match self
            .outboxes
            .iter_mut()
            .find(|(known, _, _)| known.as_str() == schema.as_str())
        {
            Some((_, known, woken)) => {
                known.extend(rows);
                *woken |= wake;
            }
            None => self.outboxes.push((schema.clone(), rows, wake)),
        }
    }
}

impl AtCommit for PendingRecords {
    fn statement(&self) -> Option<String> {
        let statements: Vec<String> = self
            .outboxes
            .iter()
            .filter(|(_, rows, _)| !rows.is_empty())
            .map(|(schema, rows, wake)| {
                let channel = wake.then(|| relay::channel(schema));
                insert_statement(schema, rows, channel.as_deref())
            })
            .collect();
        (!statements.is_empty()).then(|| statements.join("; "))
    }
}
