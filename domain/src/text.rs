//! Numbers as people read them.

/// `n` with a comma every three digits: `1234567` as `1,234,567`. Takes any
/// integer the figures come in (`u64` counts, `i64` stock).
pub fn thousands(n: impl Into<i128>) -> String {
    let n: i128 = n.into();
    let digits = n.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `s` cut to at most `max` characters, with `…` where it was cut: a value a
/// person sent, echoed back in a message without echoing all of it.
pub fn clipped(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &s[..end]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn groups_of_three() {
        assert_eq!(super::thousands(0_u64), "0");
        assert_eq!(super::thousands(999_u64), "999");
        assert_eq!(super::thousands(1_000_i64), "1,000");
        assert_eq!(super::thousands(-1_234_567_i64), "-1,234,567");
    }

    #[test]
    fn clipped_at_a_character() {
        assert_eq!(super::clipped("stock", 40), "stock");
        assert_eq!(super::clipped("ééééé", 3), "ééé…");
    }
}
