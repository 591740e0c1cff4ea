//! Formatting and parsing of sizes, modes and times for humans.

/// 1536 → "1.5K"; powers of 1024 as `ls -h` prints them.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["", "K", "M", "G", "T", "P"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n}")
    } else if v < 10.0 {
        format!("{v:.1}{}", UNITS[u])
    } else {
        format!("{v:.0}{}", UNITS[u])
    }
}

/// "1M", "64k", "4096", "1G" → bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        Some('t' | 'T') => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a size (examples: 4096, 64K, 1M, 2G)"))?;
    n.checked_mul(mult).ok_or_else(|| format!("{s:?} is too large"))
}

/// Octal permission string ("755", "0644") → bits.
pub fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| format!("{s:?} is not an octal mode such as 755 or 0644"))
}

/// `drwxr-xr-x`-style string.
pub fn mode_string(kind: shoal_client::FileKind, perm: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        shoal_client::FileKind::Dir => 'd',
        shoal_client::FileKind::Symlink => 'l',
        shoal_client::FileKind::File => '-',
    });
    let bits = [
        (0o400, 'r'),
        (0o200, 'w'),
        (0o100, 'x'),
        (0o040, 'r'),
        (0o020, 'w'),
        (0o010, 'x'),
        (0o004, 'r'),
        (0o002, 'w'),
        (0o001, 'x'),
    ];
    for (i, (bit, c)) in bits.iter().enumerate() {
        let mut ch = if perm & bit != 0 { *c } else { '-' };
        if i == 2 && perm & 0o4000 != 0 {
            ch = if ch == 'x' { 's' } else { 'S' };
        }
        if i == 5 && perm & 0o2000 != 0 {
            ch = if ch == 'x' { 's' } else { 'S' };
        }
        if i == 8 && perm & 0o1000 != 0 {
            ch = if ch == 'x' { 't' } else { 'T' };
        }
        s.push(ch);
    }
    s
}

/// Seconds since the epoch → "2026-11-22 04:05:06" (UTC).
pub fn time_string(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("64k").unwrap(), 65536);
        assert!(parse_size("x").is_err());
        assert_eq!(human_bytes(1536), "1.5K");
        assert_eq!(human_bytes(10), "10");
    }

    #[test]
    fn modes_and_times() {
        assert_eq!(mode_string(shoal_client::FileKind::Dir, 0o1755), "drwxr-xr-t");
        assert_eq!(parse_mode("0644").unwrap(), 0o644);
        assert!(parse_mode("999").is_err());
        assert_eq!(time_string(0), "1970-01-01 00:00:00");
        assert_eq!(time_string(1_795_000_000), "2026-11-18 11:06:40");
    }
}
