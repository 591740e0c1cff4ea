//! `Range: bytes=…` requests (RFC 9110 §14): which byte ranges of a file a GET sends, and
//! the multipart/byteranges framing of a response with several.
//!
//! A header this module cannot read (another unit, a syntax error, a first byte after the
//! last) is ignored and the whole file sent, as RFC 9110 says; a valid header none of whose
//! ranges overlaps the file is unsatisfiable (416).

use bytes::Bytes;

/// More ranges than this in one request are ignored (the whole file is sent): a request
/// for thousands of tiny ranges costs the server far more than the bytes it asks for.
pub(crate) const MAX_RANGES: usize = 64;

/// What a `Range` header asks of a file of a given size.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RangeRequest {
    /// No header, or one to ignore: send the whole file (200).
    Whole,
    /// Nothing of the file is asked for (416, `Content-Range: bytes */SIZE`).
    Unsatisfiable,
    /// These byte ranges, `start..end` (end exclusive, clipped to the size), in the order
    /// asked (206).
    Ranges(Vec<(u64, u64)>),
}

/// Read the value of a `Range` header for a file of `size` bytes.
pub(crate) fn parse(value: &str, size: u64) -> RangeRequest {
    let Some((unit, set)) = value.split_once('=') else { return RangeRequest::Whole };
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return RangeRequest::Whole;
    }
    let specs: Vec<&str> = set.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    if specs.is_empty() || specs.len() > MAX_RANGES {
        return RangeRequest::Whole;
    }
    let mut out = Vec::new();
    for spec in specs {
        let Some((a, b)) = spec.split_once('-') else { return RangeRequest::Whole };
        let num = |s: &str| if s.bytes().all(|c| c.is_ascii_digit()) { s.parse::<u64>().ok() } else { None };
        match (a.is_empty(), b.is_empty()) {
            // "-N": the last N bytes.
            (true, false) => {
                let Some(n) = num(b) else { return RangeRequest::Whole };
                if n > 0 && size > 0 {
                    out.push((size - n.min(size), size));
                }
            }
            // "A-": from A to the end.
            (false, true) => {
                let Some(first) = num(a) else { return RangeRequest::Whole };
                if first < size {
                    out.push((first, size));
                }
            }
            // "A-B": inclusive; B before A makes the whole header invalid.
            (false, false) => {
                let (Some(first), Some(last)) = (num(a), num(b)) else { return RangeRequest::Whole };
                if last < first {
                    return RangeRequest::Whole;
                }
                if first < size {
                    out.push((first, last.saturating_add(1).min(size)));
                }
            }
            (true, true) => return RangeRequest::Whole,
        }
    }
    if out.is_empty() {
        RangeRequest::Unsatisfiable
    } else {
        RangeRequest::Ranges(out)
    }
}

/// The framing of a multipart/byteranges body: the part headers before each range and the
/// closing delimiter, so that the body's length is known before any data is read.
pub(crate) struct Multipart {
    pub boundary: String,
    /// Before each range's bytes: delimiter, Content-Type and Content-Range lines.
    pub heads: Vec<Bytes>,
    pub tail: Bytes,
}

impl Multipart {
    pub fn new(ranges: &[(u64, u64)], size: u64, content_type: &str) -> Multipart {
        // Random, so that no file's bytes can contain the delimiter by design.
        let boundary = format!("shoal-{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>());
        let heads = ranges
            .iter()
            .map(|&(s, e)| {
                Bytes::from(format!(
                    "\r\n--{boundary}\r\nContent-Type: {content_type}\r\nContent-Range: bytes {s}-{}/{size}\r\n\r\n",
                    e - 1
                ))
            })
            .collect();
        let tail = Bytes::from(format!("\r\n--{boundary}--\r\n"));
        Multipart { boundary, heads, tail }
    }

    /// Bytes of the whole body for these ranges.
    pub fn body_len(&self, ranges: &[(u64, u64)]) -> u64 {
        let data: u64 = ranges.iter().map(|(s, e)| e - s).sum();
        data + self.heads.iter().map(|h| h.len() as u64).sum::<u64>() + self.tail.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::RangeRequest::*;
    use super::*;

    #[test]
    fn single_suffix_open_and_multiple_ranges() {
        assert_eq!(parse("bytes=0-99", 1000), Ranges(vec![(0, 100)]));
        assert_eq!(parse("bytes=-500", 1000), Ranges(vec![(500, 1000)]));
        assert_eq!(parse("bytes=-5000", 1000), Ranges(vec![(0, 1000)]));
        assert_eq!(parse("bytes=100-", 1000), Ranges(vec![(100, 1000)]));
        assert_eq!(parse("bytes=900-5000", 1000), Ranges(vec![(900, 1000)]));
        assert_eq!(parse("bytes=0-0, 10-19 ,-1", 1000), Ranges(vec![(0, 1), (10, 20), (999, 1000)]));
        assert_eq!(parse("BYTES=1-2", 1000), Ranges(vec![(1, 3)]));
        // Ranges past the end are dropped while others remain.
        assert_eq!(parse("bytes=2000-3000,0-1", 1000), Ranges(vec![(0, 2)]));
    }

    #[test]
    fn unsatisfiable_and_ignored_headers() {
        assert_eq!(parse("bytes=1000-", 1000), Unsatisfiable);
        assert_eq!(parse("bytes=-0", 1000), Unsatisfiable);
        assert_eq!(parse("bytes=0-", 0), Unsatisfiable);
        assert_eq!(parse("bytes=5-1", 1000), Whole);
        assert_eq!(parse("bytes=a-b", 1000), Whole);
        assert_eq!(parse("bytes=-", 1000), Whole);
        assert_eq!(parse("bytes=+1-2", 1000), Whole);
        assert_eq!(parse("items=0-1", 1000), Whole);
        assert_eq!(parse("bytes=", 1000), Whole);
        assert_eq!(parse("0-1", 1000), Whole);
        let many = format!("bytes={}", vec!["0-0"; MAX_RANGES + 1].join(","));
        assert_eq!(parse(&many, 1000), Whole);
    }

    #[test]
    fn multipart_length_counts_every_byte_of_the_framing() {
        let r = [(0, 10), (20, 25)];
        let m = Multipart::new(&r, 100, "application/octet-stream");
        let body: usize = m.heads.iter().map(|h| h.len()).sum::<usize>() + 15 + m.tail.len();
        assert_eq!(m.body_len(&r), body as u64);
        assert!(std::str::from_utf8(&m.heads[1]).unwrap().contains("Content-Range: bytes 20-24/100\r\n"));
    }
}
