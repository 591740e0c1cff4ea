//! Gathering cells: write-behind bytes a [`File`](crate::File) holds to send them with the
//! writes that continue them, one request per object piece instead of one per write.
//!
//! A file is cut into *cells* at every multiple of its stripe size and of [`GATHER_MAX`]
//! (see [`cell_of`]): the bytes of one cell go to one object, so one request can carry all
//! of them. A held cell keeps a buffer the size of the cell and the *runs* of it written so
//! far (sorted, disjoint, merged when they touch); writes arriving in any order (the
//! interleaved records of several processes sharing a handle, a write the kernel cut in
//! two) copy their bytes into place, a later write over held bytes replacing them. A cell
//! is *complete* when one run covers it, or when its only run reaches its end (a writer
//! that moved on); it is then sent as one request. Otherwise its runs are sent, one request
//! each, when its time is up or when a call needs them (`file.rs`).
//!
//! Everything here is memory only: no requests, no locks, no timers.

use bytes::{Bytes, BytesMut};
use shoal_proto::msg::Layout;

/// Cells end at least at every multiple of this many bytes of the file (and at every stripe
/// boundary).
pub const GATHER_MAX: u64 = 1 << 20;

/// The cell holding byte `pos`: `[start, end)`, cut at multiples of the stripe size and of
/// [`GATHER_MAX`].
pub(crate) fn cell_of(layout: &Layout, pos: u64) -> (u64, u64) {
    let stripe = layout.stripe_size.max(1);
    let start = (pos / GATHER_MAX * GATHER_MAX).max(pos / stripe * stripe);
    let next = |unit: u64| (pos / unit).saturating_add(1).saturating_mul(unit);
    (start, next(GATHER_MAX).min(next(stripe)))
}

/// One held cell.
pub(crate) struct Cell {
    /// Names the cell for the timer that ends its hold.
    pub(crate) id: u64,
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// The cell's bytes from `start` up to the end of its last run; between runs, zeros
    /// or bytes of no meaning, never sent.
    buf: BytesMut,
    /// File ranges written, sorted, disjoint and not touching.
    runs: Vec<(u64, u64)>,
    /// Writes put in it, to tell cells that gathered from cells that held one write.
    pub(crate) writes: u32,
}

impl Cell {
    /// A cell `[start, end)` holding `data` at `at` (inside it). `data` becomes the buffer
    /// when it starts the cell and nobody else refers to it (no copy).
    pub(crate) fn new(id: u64, start: u64, end: u64, at: u64, data: Bytes) -> Cell {
        debug_assert!(start <= at && at + data.len() as u64 <= end);
        let mut cell = Cell { id, start, end, buf: BytesMut::new(), runs: Vec::new(), writes: 0 };
        if at == start {
            match data.try_into_mut() {
                Ok(own) => {
                    cell.runs.push((at, at + own.len() as u64));
                    cell.buf = own;
                    cell.writes = 1;
                    return cell;
                }
                Err(shared) => {
                    cell.buf = BytesMut::with_capacity((end - start) as usize);
                    cell.put(at, &shared);
                    return cell;
                }
            }
        }
        cell.buf = BytesMut::with_capacity((end - start) as usize);
        cell.put(at, &data);
        cell
    }

    /// Copy `data` to file offset `at` (inside the cell), over what was held there.
    pub(crate) fn put(&mut self, at: u64, data: &[u8]) {
        debug_assert!(self.start <= at && at + data.len() as u64 <= self.end);
        if data.is_empty() {
            return;
        }
        let from = (at - self.start) as usize;
        let to = from + data.len();
        if self.buf.capacity() < to {
            // Room for the whole cell at once: one reallocation, not one per write.
            self.buf.reserve((self.end - self.start) as usize - self.buf.len());
        }
        if from > self.buf.len() {
            self.buf.resize(from, 0);
        }
        let inside = to.min(self.buf.len());
        self.buf[from..inside].copy_from_slice(&data[..inside - from]);
        self.buf.extend_from_slice(&data[inside - from..]);
        self.writes += 1;
        self.add_run(at, at + data.len() as u64);
    }

    fn add_run(&mut self, s: u64, e: u64) {
        // Runs that touch or overlap [s, e) merge with it.
        let first = self.runs.partition_point(|r| r.1 < s);
        let last = self.runs.partition_point(|r| r.0 <= e);
        let (mut ns, mut ne) = (s, e);
        if first < last {
            ns = ns.min(self.runs[first].0);
            ne = ne.max(self.runs[last - 1].1);
        }
        self.runs.splice(first..last, [(ns, ne)]);
    }

    /// Whether the cell is to be sent now: one run covers it, or its only run reaches its
    /// end.
    pub(crate) fn complete(&self) -> bool {
        matches!(self.runs[..], [(_, e)] if e == self.end)
    }

    /// Bytes held.
    pub(crate) fn held(&self) -> u64 {
        self.runs.iter().map(|r| r.1 - r.0).sum()
    }

    /// Whether held bytes of the cell overlap `[s, e)`.
    pub(crate) fn overlaps(&self, s: u64, e: u64) -> bool {
        self.runs.iter().any(|r| r.0 < e && s < r.1)
    }

    /// The writes to send: one per run, `(file offset, bytes)`, sharing the buffer.
    pub(crate) fn into_writes(self) -> Vec<(u64, Bytes)> {
        let buf = self.buf.freeze();
        let start = self.start;
        self.runs.into_iter().map(|(s, e)| (s, buf.slice((s - start) as usize..(e - start) as usize))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::ServerId;

    fn layout(stripe: u64) -> Layout {
        Layout { stripe_size: stripe, servers: vec![ServerId(0), ServerId(1)], replicas: 1 }
    }

    #[test]
    fn cells_end_at_stripes_and_every_mib() {
        assert_eq!(cell_of(&layout(1 << 20), 5), (0, 1 << 20));
        assert_eq!(cell_of(&layout(1 << 20), (3 << 20) + 7), (3 << 20, 4 << 20));
        // Large stripes: a cell per MiB.
        assert_eq!(cell_of(&layout(4 << 20), (5 << 20) + 1), (5 << 20, 6 << 20));
        // Small stripes: a cell per stripe.
        assert_eq!(cell_of(&layout(64 << 10), 70_000), (65_536, 131_072));
        // A stripe that is not a divisor of a MiB: cut at both.
        let l = layout(3 << 19); // 1.5 MiB
        assert_eq!(cell_of(&l, (1 << 20) + 10), (1 << 20, 3 << 19));
        assert_eq!(cell_of(&l, (3 << 19) + 10), (3 << 19, 2 << 20));
    }

    #[test]
    fn interleaved_records_in_any_order_make_one_write() {
        let (s, e) = (0u64, 1000u64);
        let rec = |i: u64| vec![i as u8 + 1; 100];
        // Records 3, 1, 0, 2, ... arrive out of order, as from two processes.
        let order = [3u64, 1, 0, 2, 5, 4, 9, 7, 6, 8];
        let first = order[0];
        let mut c = Cell::new(1, s, e, first * 100, Bytes::from(rec(first)));
        for &i in &order[1..] {
            assert!(!c.complete(), "complete before record {i}");
            c.put(i * 100, &rec(i));
        }
        assert!(c.complete());
        assert_eq!(c.writes, 10);
        let w = c.into_writes();
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].0, 0);
        let want: Vec<u8> = (0..10).flat_map(rec).collect();
        assert_eq!(&w[0].1[..], &want[..]);
    }

    #[test]
    fn runs_with_gaps_go_as_one_write_each_and_later_bytes_win() {
        let mut c = Cell::new(1, 1000, 2000, 1100, Bytes::from(vec![1u8; 100]));
        c.put(1500, &[2u8; 100]);
        c.put(1150, &[3u8; 100]); // overlaps the first run's end: replaces, extends it
        assert!(!c.complete());
        assert_eq!(c.held(), 250);
        assert!(c.overlaps(1240, 1260) && !c.overlaps(1250, 1500) && c.overlaps(1599, 1700));
        let w = c.into_writes();
        assert_eq!(w.iter().map(|(o, b)| (*o, b.len())).collect::<Vec<_>>(), vec![(1100, 150), (1500, 100)]);
        assert_eq!(&w[0].1[..50], &[1u8; 50]);
        assert_eq!(&w[0].1[50..], &[3u8; 100]);
    }

    #[test]
    fn a_run_reaching_the_end_completes_its_cell_and_a_starting_buffer_is_not_copied() {
        // With room for the rest, as a FUSE mount allocates a write's buffer.
        let mut v = Vec::with_capacity(1000);
        v.extend_from_slice(&[9u8; 900]);
        let data = Bytes::from(v);
        let ptr = data.as_ptr();
        let mut c = Cell::new(1, 0, 1000, 0, data);
        c.put(900, &[8u8; 100]);
        assert!(c.complete());
        let w = c.into_writes();
        assert_eq!(w[0].1.as_ptr(), ptr, "the first write's buffer holds the cell");
        // A writer that started inside the cell: its run reaching the end completes it.
        let mut c = Cell::new(2, 0, 1000, 300, Bytes::from(vec![1u8; 600]));
        assert!(!c.complete());
        c.put(900, &[1u8; 100]);
        assert!(c.complete());
        assert_eq!(c.into_writes()[0], (300, Bytes::from(vec![1u8; 700])));
    }
}
