//! The compile-time check that a key holds a part that is not a timestamp (see
//! [the rule](crate::key#keys-made-only-of-timestamps)), as `#[idempotent]` generates it. Its items
//! are named in that check's compile errors; they are not meant to be used otherwise.
//!
//! Each key field is classified by method resolution on its concrete type ("autoref
//! specialization"): `Identifies` if it implements [`SoleKeyPart`], [`OnlyTimestamps`] if
//! it implements only [`KeyPart`], and `Identifies` again if it is no key part at all,
//! so that such a field gets the one error of its own (no canonical encoding) rather than
//! a second one about timestamps. The classes are folded with [`Or`], and
//! [`key_identifies_a_fact`] requires the result to be `Identifies`.
//!
//! ```ignore
//! use idem_runtime::__private_v0_1_0::identifies::*;
//! key_identifies_a_fact(Or::or(
//!     (&&&Probe(&event.order_id)).key_part_class(),
//!     (&&&Probe(&event.created_at)).key_part_class(),
//! ));
//! ```

use crate::key::{KeyPart, SoleKeyPart};

/// A key part that identifies something, or a value that is no key part.
// Hidden, so that the compile error of a key of timestamps does not list it.
#[doc(hidden)]
pub struct Identifies;

/// A key part that is only timestamps (instants in time).
pub struct OnlyTimestamps;

/// A key field, to classify with `(&&&Probe(&field)).key_part_class()`.
pub struct Probe<'a, T: ?Sized>(pub &'a T);

/// The first choice: the field implements [`SoleKeyPart`].
pub trait ClassifySole {
    /// [`Identifies`].
    fn key_part_class(&self) -> Identifies {
        Identifies
    }
}
impl<T: SoleKeyPart + ?Sized> ClassifySole for &&Probe<'_, T> {}

/// The second choice: the field implements only [`KeyPart`].
pub trait ClassifyInstant {
    /// [`OnlyTimestamps`].
    fn key_part_class(&self) -> OnlyTimestamps {
        OnlyTimestamps
    }
}
impl<T: KeyPart + ?Sized> ClassifyInstant for &Probe<'_, T> {}

/// The last choice: the field is no key part; its own error says why.
pub trait ClassifyOther {
    /// [`Identifies`], so that the field gets one error, not two.
    fn key_part_class(&self) -> Identifies {
        Identifies
    }
}
impl<T: ?Sized> ClassifyOther for Probe<'_, T> {}

/// Whether either of two classes identifies.
pub trait Or<Other> {
    /// The class of both parts together.
    type Output;
    /// Folds two classes.
    fn or(self, other: Other) -> Self::Output;
}
impl<Other> Or<Other> for Identifies {
    type Output = Identifies;
    fn or(self, _: Other) -> Identifies {
        Identifies
    }
}
impl Or<Identifies> for OnlyTimestamps {
    type Output = Identifies;
    fn or(self, _: Identifies) -> Identifies {
        Identifies
    }
}
impl Or<OnlyTimestamps> for OnlyTimestamps {
    type Output = OnlyTimestamps;
    fn or(self, _: OnlyTimestamps) -> OnlyTimestamps {
        OnlyTimestamps
    }
}

/// The class of a key that identifies a business fact.
#[diagnostic::on_unimplemented(
    message = "this key is made only of timestamps, which do not identify a business fact",
    label = "every field of this key is an instant in time",
    note = "two facts can happen at the same instant and one fact can be stamped twice: add the business id to the key, e.g. `key = \"order_id, created_at\"`",
    note = "`DateTime` and `NaiveDateTime` are instants, and so are an `Option`, a `Vec`, a slice or an array of them and a newtype deriving `KeyPart` around one; a `NaiveDate` (a business day) is not"
)]
pub trait IdentifiesAFact {}
impl IdentifiesAFact for Identifies {}

/// Requires the folded class of a key's fields to identify a business fact.
pub fn key_identifies_a_fact<C: IdentifiesAFact>(_: C) {}
