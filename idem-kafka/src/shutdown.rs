//! The usual graceful-shutdown trigger.

/// Completes on Ctrl-C or, on Unix, SIGTERM: pass it to
/// [`Consumer::run`](crate::Consumer::run) to finish the current message (or batch),
/// commit what was processed and leave the group.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(_) => {
                tokio::signal::ctrl_c().await.ok();
            }
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await.ok();
    }
}
