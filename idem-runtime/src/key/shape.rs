//! The shape of a key part's encoding: which tags its values encode with, independent of
//! the values. A scope records the shapes of its key's parts (see
//! [`scope`](crate::scope)), so that a deploy whose parts would encode differently, and
//! so derive other keys for the same facts, is refused before it claims anything.

use chrono::{DateTime, NaiveDate, NaiveDateTime, TimeZone};
use uuid::Uuid;

use super::IdempotencyKey;

/// The shape of a type's key encoding: which tags its values encode with, independent of
/// the values, as a scope records each part of its key (see [`scope`](crate::scope)).
///
/// | shape | types |
/// |-------|-------|
/// | `s` | `str`, `String`, `char`; an enum deriving [`KeyPart`](super::KeyPart) whose variants have no fields |
/// | `i` | every integer type (they encode alike, so `i32` to `i64` keeps the keys) |
/// | `b` | `bool` |
/// | `u` | `Uuid`, [`IdempotencyKey`](super::IdempotencyKey) |
/// | `t` | `chrono::DateTime<Tz>`, `chrono::NaiveDateTime` |
/// | `d` | `chrono::NaiveDate` |
/// | `l[T]` | `[T]`, `[T; N]`, `Vec<T>`: a list of `T` |
/// | `l(a A,b B)` | a struct deriving `KeyPart` with several fields, by name (or index) and shape, in order |
/// | `e` | an enum deriving `KeyPart` with a variant that has fields |
/// | `?` | a type whose shape is not known: a `KeyPart` implemented by hand without [`KeyPartShape`], a field of a generic type |
///
/// `Option<T>`, `&T` and `Box<T>` have the shape of `T`; a struct deriving `KeyPart` with
/// one field has its field's.
///
/// Implemented for every [`KeyPart`](super::KeyPart) of this crate, and by
/// `#[derive(KeyPart)]`. A `KeyPart` implemented by hand may implement it too, writing
/// the shape of the tags its `encode_key_part` writes; without it, the part's shape is
/// recorded as `?`, and a change of its type is not noticed.
pub trait KeyPartShape {
    /// Appends the shape of `Self`'s encoding to `shape`.
    fn key_shape(shape: &mut String);
}

/// The shape of a type that does not implement [`KeyPartShape`].
pub const UNKNOWN_SHAPE: &str = "?";

macro_rules! leaf_shapes {
    ($tag:literal: $($ty:ty),*) => {$(
        impl KeyPartShape for $ty {
            fn key_shape(shape: &mut String) {
                shape.push_str($tag);
            }
        }
    )*};
}
leaf_shapes!("s": str, String, char);
leaf_shapes!("i": i8, i16, i32, i64, i128, isize, u8, u16, u32, u64, u128, usize);
leaf_shapes!("b": bool);
leaf_shapes!("u": Uuid, IdempotencyKey);
leaf_shapes!("t": NaiveDateTime);
leaf_shapes!("d": NaiveDate);

impl<Tz: TimeZone> KeyPartShape for DateTime<Tz> {
    fn key_shape(shape: &mut String) {
        shape.push('t');
    }
}

impl<T: KeyPartShape + ?Sized> KeyPartShape for &T {
    fn key_shape(shape: &mut String) {
        T::key_shape(shape);
    }
}

impl<T: KeyPartShape + ?Sized> KeyPartShape for Box<T> {
    fn key_shape(shape: &mut String) {
        T::key_shape(shape);
    }
}

impl<T: KeyPartShape> KeyPartShape for Option<T> {
    fn key_shape(shape: &mut String) {
        T::key_shape(shape);
    }
}

impl<T: KeyPartShape> KeyPartShape for [T] {
    fn key_shape(shape: &mut String) {
        shape.push_str("l[");
        T::key_shape(shape);
        shape.push(']');
    }
}

impl<T: KeyPartShape, const N: usize> KeyPartShape for [T; N] {
    fn key_shape(shape: &mut String) {
        <[T]>::key_shape(shape);
    }
}

impl<T: KeyPartShape> KeyPartShape for Vec<T> {
    fn key_shape(shape: &mut String) {
        <[T]>::key_shape(shape);
    }
}

/// The shape of a value's type, by method resolution on its concrete type: its
/// [`KeyPartShape`], or [`UNKNOWN_SHAPE`] for a type without one. What generated code
/// calls, as `(&&ShapeProbe(&value)).shape_of()`.
#[doc(hidden)]
pub struct ShapeProbe<'a, T: ?Sized>(pub &'a T);

/// The first choice of [`ShapeProbe`]: the type's own shape.
#[doc(hidden)]
pub trait ShapeKnown {
    /// The function that writes the shape.
    fn shape_of(&self) -> fn(&mut String);
}
impl<T: KeyPartShape + ?Sized> ShapeKnown for &ShapeProbe<'_, T> {
    fn shape_of(&self) -> fn(&mut String) {
        T::key_shape
    }
}

/// The shape of a type, as [`ShapeProbe`] finds it for a value: what
/// `#[derive(KeyPart)]` calls for its fields, as `(&&ShapeOfType::<T>::new()).shape_of()`.
/// A field of a generic type has the unknown shape.
#[doc(hidden)]
pub struct ShapeOfType<T: ?Sized>(core::marker::PhantomData<fn(&T)>);

impl<T: ?Sized> ShapeOfType<T> {
    /// The probe of `T`.
    pub const fn new() -> Self {
        ShapeOfType(core::marker::PhantomData)
    }
}

impl<T: ?Sized> Default for ShapeOfType<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: KeyPartShape + ?Sized> ShapeKnown for &ShapeOfType<T> {
    fn shape_of(&self) -> fn(&mut String) {
        T::key_shape
    }
}

impl<T: ?Sized> ShapeUnknown for ShapeOfType<T> {
    fn shape_of(&self) -> fn(&mut String) {
        |shape| shape.push_str(UNKNOWN_SHAPE)
    }
}

/// The fallback of [`ShapeProbe`]: a type without a [`KeyPartShape`].
#[doc(hidden)]
pub trait ShapeUnknown {
    /// The function that writes [`UNKNOWN_SHAPE`].
    fn shape_of(&self) -> fn(&mut String);
}
impl<T: ?Sized> ShapeUnknown for ShapeProbe<'_, T> {
    fn shape_of(&self) -> fn(&mut String) {
        |shape| shape.push_str(UNKNOWN_SHAPE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape<T: KeyPartShape + ?Sized>() -> String {
        let mut shape = String::new();
        T::key_shape(&mut shape);
        shape
    }

    #[test]
    fn shapes_follow_the_encoding() {
        assert_eq!(shape::<String>(), "s");
        assert_eq!(shape::<&str>(), "s");
        assert_eq!(shape::<i32>(), shape::<i64>());
        assert_eq!(shape::<Option<u8>>(), "i");
        assert_eq!(shape::<Vec<Uuid>>(), "l[u]");
        assert_eq!(shape::<[u8; 16]>(), shape::<Vec<u8>>());
        assert_eq!(shape::<DateTime<chrono::Utc>>(), "t");
        assert_eq!(shape::<NaiveDate>(), "d");
    }

    #[test]
    // The borrows choose the probe's method, as in generated code.
    #[allow(clippy::needless_borrow)]
    fn a_type_without_a_shape_is_unknown() {
        #[allow(unused_imports)]
        use super::{ShapeKnown as _, ShapeUnknown as _};
        struct Opaque;
        let mut known = String::new();
        (&&ShapeProbe(&7_u16)).shape_of()(&mut known);
        let mut unknown = String::new();
        (&&ShapeProbe(&Opaque)).shape_of()(&mut unknown);
        assert_eq!((known.as_str(), unknown.as_str()), ("i", "?"));
    }
}
