//! Values shown in the kit's panic messages, cut short: a handler error may carry a
//! megabyte of text.

use std::fmt::{self, Debug};

/// The most of a value's `Debug` text a message shows (as the status table stores at
/// most 2 KiB of an error text).
const MOST: usize = 2048;

/// Shows the `Debug` text of a value, at most 2 KiB of it.
pub(crate) struct Brief<'a, T: ?Sized>(pub &'a T);

impl<T: Debug + ?Sized> Debug for Brief<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = format!("{:?}", self.0);
        if text.len() <= MOST {
            return f.write_str(&text);
        }
        let mut cut = MOST;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        write!(f, "{}… ({} more bytes)", &text[..cut], text.len() - cut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_value_is_cut_at_a_character_boundary() {
        let long = "é".repeat(3000);
        let shown = format!("{:?}", Brief(&long));
        assert!(shown.len() < MOST + 40, "{} bytes", shown.len());
        assert!(shown.ends_with("more bytes)"), "{shown}");
        assert_eq!(format!("{:?}", Brief(&"short")), "\"short\"");
    }
}
