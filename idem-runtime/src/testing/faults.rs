//! Faults a test arms on a runtime handle: [`inject`] and its [`Injection`]. The points of
//! the runtime that fire them are in the crate's `faults` module.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::Idem;
pub use crate::faults::Fault;

/// A fault armed on a runtime handle by [`inject`]. Dropping it disarms the fault if it
/// has not fired.
///
/// ```no_run
/// # use idem_runtime::{Idem, Outcome, Error};
/// # async fn ship(idem: &Idem, order: &str) -> Result<Outcome<()>, Error<std::io::Error>> { todo!() }
/// # async fn test(idem: Idem) {
/// use idem_runtime::testing::{self, Fault};
///
/// let injection = testing::inject(&idem, Fault::KillBackendInBody);
/// let _ = ship(&idem, "o-1").await;
/// assert!(injection.disarm(), "the delivery did not reach its body");
/// # }
/// ```
#[derive(Debug)]
#[must_use = "the fault is disarmed when the injection is dropped"]
pub struct Injection {
    idem: Idem,
    fault: Fault,
    fired: Arc<AtomicBool>,
}

impl Injection {
    /// The fault.
    pub fn fault(&self) -> Fault {
        self.fault
    }

    /// Whether a delivery reached the fault's point and the fault fired.
    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }

    /// Disarms the fault if it has not fired; returns whether it fired.
    pub fn disarm(self) -> bool {
        self.fired()
    }
}

impl Drop for Injection {
    fn drop(&mut self) {
        self.idem.faults().disarm(&self.fired);
    }
}

/// Arms `fault` on `idem` (and its clones): the next delivery through it that reaches
/// the fault's point fires it, once. Another fault armed on the handle is replaced.
///
/// ```no_run
/// # use idem_runtime::{Idem, Outcome, Error};
/// # async fn ship(idem: &Idem, order: &str) -> Result<Outcome<()>, Error<std::io::Error>> { todo!() }
/// # async fn test(idem: Idem) {
/// use idem_runtime::testing::{self, Fault};
///
/// let injection = testing::inject(&idem, Fault::FailBeforeCommit);
/// let delivered = ship(&idem, "o-1").await;
/// assert!(injection.fired());
/// assert!(matches!(delivered, Err(Error::Database(_))));
/// # }
/// ```
pub fn inject(idem: &Idem, fault: Fault) -> Injection {
    let fired = Arc::new(AtomicBool::new(false));
    idem.faults().arm(fault, fired.clone());
    Injection {
        idem: idem.clone(),
        fault,
        fired,
    }
}
