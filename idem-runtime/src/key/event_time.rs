//! The fact's own time, which a handler names with `#[idempotent(event_time = "...")]`:
//! the key field whose value buckets the handler's keys (see [`time_buckets`](crate::time_buckets)).

use std::time::{SystemTime, UNIX_EPOCH};

use chrono::{DateTime, NaiveDateTime, TimeZone, Utc};

use super::{KeyEncoder, KeyPart, KeyPartShape, MissingValue};

/// A field that can be a handler's `event_time`: an instant, the same on every delivery
/// and every re-send of the same fact.
///
/// Implemented for chrono's `DateTime<Tz>` and `NaiveDateTime` (read as UTC),
/// `std::time::SystemTime`, and `Option`, `&` and `Box` of them (`None` has no time: the
/// key cannot be derived either, since the field is one of the key's). For `time`'s
/// `OffsetDateTime`, or an integer of epoch milliseconds, keep a `DateTime<Utc>` field
/// (`DateTime::from_timestamp_millis`) next to it and name that one.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a time that keys can be bucketed by",
    label = "`event_time` names this field",
    note = "`event_time` takes a field holding the fact's own time: chrono's `DateTime<Tz>` or `NaiveDateTime` (read as UTC), or `std::time::SystemTime`, or an `Option` of one"
)]
pub trait EventTime {
    /// The instant, or `None` when the value is absent.
    fn event_time(&self) -> Option<DateTime<Utc>>;
}

impl<Tz: TimeZone> EventTime for DateTime<Tz> {
    fn event_time(&self) -> Option<DateTime<Utc>> {
        Some(self.with_timezone(&Utc))
    }
}

impl EventTime for NaiveDateTime {
    fn event_time(&self) -> Option<DateTime<Utc>> {
        Some(self.and_utc())
    }
}

/// An instant outside chrono's range (some 262,000 years either way) is its nearest end,
/// which is outside every window.
impl EventTime for SystemTime {
    fn event_time(&self) -> Option<DateTime<Utc>> {
        let nanos = nanos_since_epoch(*self);
        let seconds = i64::try_from(nanos.div_euclid(1_000_000_000)).ok();
        let subsec = u32::try_from(nanos.rem_euclid(1_000_000_000)).unwrap_or(0);
        Some(
            seconds
                .and_then(|seconds| DateTime::from_timestamp(seconds, subsec))
                .unwrap_or(if nanos < 0 {
                    DateTime::<Utc>::MIN_UTC
                } else {
                    DateTime::<Utc>::MAX_UTC
                }),
        )
    }
}

/// Nanoseconds since 1970-01-01T00:00:00Z, before it negative.
fn nanos_since_epoch(time: SystemTime) -> i128 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i128::try_from(after.as_nanos()).unwrap_or(i128::MAX),
        Err(before) => -i128::try_from(before.duration().as_nanos()).unwrap_or(i128::MAX),
    }
}

impl<T: EventTime> EventTime for Option<T> {
    fn event_time(&self) -> Option<DateTime<Utc>> {
        self.as_ref().and_then(EventTime::event_time)
    }
}

impl<T: EventTime + ?Sized> EventTime for &T {
    fn event_time(&self) -> Option<DateTime<Utc>> {
        (**self).event_time()
    }
}

impl<T: EventTime + ?Sized> EventTime for Box<T> {
    fn event_time(&self) -> Option<DateTime<Utc>> {
        (**self).event_time()
    }
}

/// The fact time of a message, for the code `#[idempotent]` generates: the instant to the
/// microsecond (PostgreSQL's precision), or `None` when the field holds none.
pub fn fact_time<T: EventTime + ?Sized>(value: &T) -> Option<DateTime<Utc>> {
    let instant = value.event_time()?;
    // Rounded down to the microsecond, as `timestamptz` keeps it, so that the value a
    // claim binds is the value stored, whatever the field's precision.
    let micros = instant.timestamp_micros();
    DateTime::from_timestamp_micros(micros)
}

/// An instant of the system clock: as a key part it encodes as the `DateTime<Utc>` of the
/// same instant (nanoseconds since 1970), so that a field's type changed between the two
/// keeps the keys; an instant chrono cannot hold encodes the same way.
impl KeyPart for SystemTime {
    fn encode_key_part(&self, encoder: &mut KeyEncoder) -> Result<(), MissingValue> {
        encoder.instant_nanos(nanos_since_epoch(*self));
        Ok(())
    }
}

impl KeyPartShape for SystemTime {
    fn key_shape(shape: &mut String) {
        shape.push('t');
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use chrono::FixedOffset;

    use super::*;
    use crate::key::KeyBuilder;

    #[test]
    fn the_same_instant_in_any_type_is_one_fact_time_and_one_key() {
        let system = UNIX_EPOCH + Duration::from_nanos(1_765_000_000_123_456_789);
        let utc = DateTime::<Utc>::from(system);
        let paris = utc.with_timezone(&FixedOffset::east_opt(3600).unwrap());
        assert_eq!(fact_time(&system), fact_time(&utc));
        assert_eq!(fact_time(&paris), fact_time(&Some(utc)));
        assert_eq!(
            fact_time(&utc).unwrap().timestamp_subsec_nanos(),
            123_456_000,
            "to the microsecond"
        );
        let key = |part: &dyn KeyPart| {
            KeyBuilder::new()
                .part("order_id", "o-1")
                .unwrap()
                .part("at", part)
                .unwrap()
                .finish()
        };
        assert_eq!(key(&system), key(&utc));
    }

    #[test]
    fn a_system_time_beyond_chronos_range_is_its_end_and_still_a_key() {
        let far = UNIX_EPOCH + Duration::from_secs(300_000 * 365 * 86_400);
        assert_eq!(fact_time(&far), fact_time(&DateTime::<Utc>::MAX_UTC));
        let before = UNIX_EPOCH - Duration::from_secs(300_000 * 365 * 86_400);
        assert_eq!(fact_time(&before), fact_time(&DateTime::<Utc>::MIN_UTC));
        assert!(KeyBuilder::new().part("at", &far).is_ok());
        let before_1970 = UNIX_EPOCH - Duration::from_nanos(1_500_000_001);
        let key = |part: &dyn KeyPart| KeyBuilder::new().part("at", part).unwrap().finish();
        assert_eq!(
            key(&before_1970),
            key(&DateTime::<Utc>::from(before_1970)),
            "before 1970, as chrono encodes it"
        );
    }

    #[test]
    fn none_has_no_time() {
        assert_eq!(fact_time(&None::<DateTime<Utc>>), None);
    }
}
