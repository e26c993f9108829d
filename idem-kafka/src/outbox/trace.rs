//! The trace context that a consumer's handling carries into the records its handler
//! sends: W3C Trace Context, `traceparent` = `00-<trace id>-<parent id>-<flags>`.

use std::future::Future;

use uuid::Uuid;

tokio::task_local! {
    static TRACE: TraceContext;
}

/// The trace of the message being handled in this task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TraceContext {
    /// 32 lowercase hexadecimal digits, not all zero.
    trace_id: String,
    /// 2 hexadecimal digits.
    flags: String,
}

impl TraceContext {
    /// The incoming `traceparent`, if it is valid (version 00, or a later version read as
    /// version 00); otherwise a new trace, sampled.
    pub(crate) fn of_incoming(header: Option<&[u8]>) -> Self {
        header
            .and_then(|value| std::str::from_utf8(value).ok())
            .and_then(Self::parse)
            .unwrap_or_else(|| TraceContext {
                trace_id: Uuid::new_v4().simple().to_string(),
                flags: "01".to_owned(),
            })
    }

    fn parse(value: &str) -> Option<Self> {
        let mut parts = value.trim().split('-');
        let (version, trace_id, parent, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex = |text: &str, len: usize| {
            text.len() == len
                && text
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        // Version 00 has exactly these four fields; a later version (01 to fe) may append
        // more, which are ignored, as W3C Trace Context asks of a version-00 parser.
        let known_fields = match version {
            "00" => parts.next().is_none(),
            "ff" => false,
            _ => hex(version, 2),
        };
        let valid = known_fields
            && hex(trace_id, 32)
            && trace_id.bytes().any(|b| b != b'0')
            && hex(parent, 16)
            && parent.bytes().any(|b| b != b'0')
            && hex(flags, 2);
        valid.then(|| TraceContext {
            trace_id: trace_id.to_owned(),
            flags: flags.to_owned(),
        })
    }

    /// The trace context of this task, if a consumer is handling a message in it.
    pub(crate) fn current() -> Option<Self> {
        TRACE.try_with(Clone::clone).ok()
    }

    /// A `traceparent` for a record sent in this trace: the trace's id, a new span id.
    pub(crate) fn child(&self) -> String {
        let span: String = Uuid::new_v4().simple().to_string()[..16].to_owned();
        format!("00-{}-{span}-{}", self.trace_id, self.flags)
    }

    /// The `traceparent` text of the trace itself (for the consumer's span).
    pub(crate) fn trace_id(&self) -> &str {
        &self.trace_id
    }

    /// Runs `future` with this trace as the task's.
    pub(crate) async fn run<F: Future>(self, future: F) -> F::Output {
        TRACE.scope(self, future).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_incoming_trace_is_continued_and_a_bad_one_replaced() {
        let incoming = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let trace = TraceContext::of_incoming(Some(incoming));
        assert_eq!(trace.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let child = trace.child();
        assert!(child.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
        assert!(child.ends_with("-01"));
        assert_ne!(child, String::from_utf8_lossy(incoming));
        // A later version is read as version 00, its extra fields ignored.
        let later = b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-later";
        assert_eq!(
            TraceContext::of_incoming(Some(later)).trace_id(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        for bad in [
            &b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"[..],
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"garbage",
        ] {
            let fresh = TraceContext::of_incoming(Some(bad));
            assert_eq!(fresh.trace_id().len(), 32);
            assert_ne!(fresh.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        }
    }
}
