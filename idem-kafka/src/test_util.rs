//! Test hooks (feature `test-util`): not part of the stable API.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Stops a consumer the way a crash would: from the moment it is pulled, the consumer
/// commits and stores no offset any more, so the messages it processed since its last
/// commit are delivered again to the member that takes its partitions over. A relay's
/// ([`Relay::kill_switch`](crate::outbox::Relay::kill_switch)) stops it after the broker
/// acknowledged its round and before the records are marked sent.
#[derive(Debug, Clone)]
pub struct KillSwitch(Arc<AtomicBool>);

impl KillSwitch {
    pub(crate) fn new(flag: Arc<AtomicBool>) -> Self {
        KillSwitch(flag)
    }

    /// Pulls the switch. Then abort (or drop) the task running
    /// [`Consumer::run`](crate::Consumer::run); a relay's `run` returns by itself.
    pub fn kill(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}
