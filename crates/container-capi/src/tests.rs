//! The C API called as C would call it, from OS threads that are the tasks, over a
//! `shoal_comm` whose callbacks are `extern "C"` functions on shared memory (what an MPI
//! adapter does with messages): a container written and read collectively, the serial
//! calls, every comm freed exactly once (also those made by `split`, and on failures), and
//! the errors of bad arguments.

use super::*;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

/// Tasks of one group, on threads.
struct Group {
    size: usize,
    barrier: Barrier,
    slots: Mutex<Vec<Vec<u8>>>,
    /// Groups being made by a split, by color.
    splits: Mutex<HashMap<u64, Arc<Group>>>,
}

impl Group {
    fn new(size: usize) -> Arc<Group> {
        Arc::new(Group {
            size,
            barrier: Barrier::new(size),
            slots: Mutex::new(vec![Vec::new(); size]),
            splits: Mutex::new(HashMap::new()),
        })
    }
}

/// What a comm's `user` points at.
struct Member {
    rank: usize,
    group: Arc<Group>,
    /// Comms freed so far (shared by every member of every group of one test).
    freed: Arc<AtomicUsize>,
}

fn member<'a>(user: *mut c_void) -> &'a Member {
    // SAFETY: every comm of these tests has a `Member` as its user.
    unsafe { &*(user as *const Member) }
}

unsafe extern "C" fn rank(user: *mut c_void) -> c_int {
    member(user).rank as c_int
}

unsafe extern "C" fn size(user: *mut c_void) -> c_int {
    member(user).group.size as c_int
}

unsafe extern "C" fn barrier(user: *mut c_void) -> c_int {
    member(user).group.barrier.wait();
    0
}

unsafe extern "C" fn bcast(user: *mut c_void, buf: *mut c_void, len: usize, root: c_int) -> c_int {
    let m = member(user);
    if m.rank == root as usize {
        m.group.slots.lock()[0] = std::slice::from_raw_parts(buf as *const u8, len).to_vec();
    }
    m.group.barrier.wait();
    let got = m.group.slots.lock()[0].clone();
    m.group.barrier.wait();
    if got.len() != len {
        return libc::EMSGSIZE;
    }
    std::ptr::copy_nonoverlapping(got.as_ptr(), buf as *mut u8, len);
    0
}

unsafe extern "C" fn gatherv(
    user: *mut c_void,
    send: *const c_void,
    len: usize,
    recv: *mut c_void,
    lens: *const usize,
    root: c_int,
) -> c_int {
    let m = member(user);
    m.group.slots.lock()[m.rank] = std::slice::from_raw_parts(send as *const u8, len).to_vec();
    m.group.barrier.wait();
    let mut rc = 0;
    if m.rank == root as usize {
        assert!(!recv.is_null() && !lens.is_null(), "recv and lens at the root");
        let lens = std::slice::from_raw_parts(lens, m.group.size);
        let mut at = 0;
        for (slot, &l) in m.group.slots.lock().iter().zip(lens) {
            if slot.len() != l {
                rc = libc::EMSGSIZE;
                break;
            }
            std::ptr::copy_nonoverlapping(slot.as_ptr(), (recv as *mut u8).add(at), l);
            at += l;
        }
    } else {
        assert!(recv.is_null() && lens.is_null(), "recv and lens at the root only");
    }
    m.group.barrier.wait();
    rc
}

unsafe extern "C" fn scatterv(
    user: *mut c_void,
    send: *const c_void,
    lens: *const usize,
    recv: *mut c_void,
    len: usize,
    root: c_int,
) -> c_int {
    let m = member(user);
    if m.rank == root as usize {
        let lens = std::slice::from_raw_parts(lens, m.group.size);
        let mut at = 0;
        let mut slots = m.group.slots.lock();
        for (slot, &l) in slots.iter_mut().zip(lens) {
            *slot = std::slice::from_raw_parts((send as *const u8).add(at), l).to_vec();
            at += l;
        }
    }
    m.group.barrier.wait();
    let mine = m.group.slots.lock()[m.rank].clone();
    m.group.barrier.wait();
    if mine.len() != len {
        return libc::EMSGSIZE;
    }
    std::ptr::copy_nonoverlapping(mine.as_ptr(), recv as *mut u8, len);
    0
}

unsafe extern "C" fn split(user: *mut c_void, color: u64, key: u64, out: *mut shoal_comm) -> c_int {
    let m = member(user);
    let mut tag = color.to_le_bytes().to_vec();
    tag.extend_from_slice(&key.to_le_bytes());
    m.group.slots.lock()[m.rank] = tag;
    m.group.barrier.wait();
    let tags: Vec<(u64, u64, usize)> = m
        .group
        .slots
        .lock()
        .iter()
        .enumerate()
        .map(|(r, t)| {
            (u64::from_le_bytes(t[..8].try_into().unwrap()), u64::from_le_bytes(t[8..].try_into().unwrap()), r)
        })
        .collect();
    let mut same: Vec<(u64, usize)> = tags.iter().filter(|t| t.0 == color).map(|t| (t.1, t.2)).collect();
    same.sort();
    let new_rank = same.iter().position(|&(_, r)| r == m.rank).unwrap();
    let group = m.group.splits.lock().entry(color).or_insert_with(|| Group::new(same.len())).clone();
    m.group.barrier.wait();
    if m.rank == 0 {
        m.group.splits.lock().clear();
    }
    m.group.barrier.wait();
    *out = comm(Member { rank: new_rank, group, freed: m.freed.clone() });
    0
}

unsafe extern "C" fn free(user: *mut c_void) {
    let m = Box::from_raw(user as *mut Member);
    m.freed.fetch_add(1, Ordering::SeqCst);
}

fn comm(m: Member) -> shoal_comm {
    shoal_comm {
        user: Box::into_raw(Box::new(m)) as *mut c_void,
        rank: Some(rank),
        size: Some(size),
        barrier: Some(barrier),
        bcast: Some(bcast),
        gatherv: Some(gatherv),
        scatterv: Some(scatterv),
        split: Some(split),
        free: Some(free),
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

fn last_error() -> String {
    // SAFETY: the library's NUL-terminated message of this thread.
    unsafe { CStr::from_ptr(shoal_container_last_error()) }.to_string_lossy().into_owned()
}

/// Task `r`'s data.
fn data(r: usize) -> Vec<u8> {
    (0..3000 + r * 5000).map(|i| (i * 7 + r * 13 + (i >> 10)) as u8).collect()
}

/// `n` threads run `task(rank, comm)`; the comms (and any split from them) are counted
/// when freed.
fn tasks(n: usize, freed: &Arc<AtomicUsize>, task: impl Fn(usize, shoal_comm) + Sync) {
    let group = Group::new(n);
    std::thread::scope(|s| {
        for r in 0..n {
            let m = Member { rank: r, group: group.clone(), freed: freed.clone() };
            let task = &task;
            s.spawn(move || task(r, comm(m)));
        }
    });
}

#[test]
fn tasks_on_threads_write_and_read_a_container_through_callbacks() {
    let dir = tempfile::tempdir().unwrap();
    let name = CString::new(dir.path().join("c").to_str().unwrap()).unwrap();
    let (w, r) = (CString::new("w").unwrap(), CString::new("rb").unwrap());
    let freed = Arc::new(AtomicUsize::new(0));
    let n = 5;
    tasks(n, &freed, |rank, c| {
        let h = shoal_container_paropen(name.as_ptr(), w.as_ptr(), 2000, 2, 4096, &c, std::ptr::null());
        assert!(!h.is_null(), "{}", last_error());
        for piece in data(rank).chunks(1500) {
            assert_eq!(shoal_container_ensure_free_space(h, piece.len() as u64), 0);
            assert_eq!(shoal_container_fwrite(piece.as_ptr() as *const c_void, 1, piece.len(), h), piece.len());
        }
        assert_eq!(shoal_container_parclose(h), 0, "{}", last_error());
    });
    // Each task's comm, and the group of its physical file split from it at the close.
    assert_eq!(freed.swap(0, Ordering::SeqCst), 2 * n);

    tasks(n, &freed, |rank, c| {
        let h = shoal_container_paropen(name.as_ptr(), r.as_ptr(), 0, 0, 0, &c, std::ptr::null());
        assert!(!h.is_null(), "{}", last_error());
        let mut info = shoal_container_info::default();
        assert_eq!(shoal_container_get_info(h, &mut info), 0);
        assert_eq!((info.rank, info.ntasks, info.nfiles, info.chunk_size), (rank as u64, n as u64, 2, 4096));
        let want = data(rank);
        let mut got = vec![0u8; want.len() + 100];
        assert_eq!(shoal_container_fread(got.as_mut_ptr() as *mut c_void, 1, got.len(), h), want.len());
        assert_eq!(&got[..want.len()], &want[..], "rank {rank}");
        assert_eq!(shoal_container_feof(h), 1);
        assert_eq!(shoal_container_parclose(h), 0, "{}", last_error());
    });
    assert_eq!(freed.swap(0, Ordering::SeqCst), n);

    // Serially: every logical file, and where it lies.
    let s = shoal_container_open(name.as_ptr(), std::ptr::null());
    assert!(!s.is_null(), "{}", last_error());
    let (mut ntasks, mut maxchunks) = (0, 0);
    let (mut sizes, mut counts, mut used) = (std::ptr::null(), std::ptr::null(), std::ptr::null());
    assert_eq!(shoal_container_get_locations(s, &mut ntasks, &mut maxchunks, &mut sizes, &mut counts, &mut used), 0);
    assert_eq!(ntasks, n as u64);
    for rank in 0..n {
        // SAFETY: arrays of the handle, of ntasks and ntasks * maxchunks entries.
        let (size, count) = unsafe { (*sizes.add(rank), *counts.add(rank)) };
        let row = unsafe { std::slice::from_raw_parts(used.add(rank * maxchunks as usize), count as usize) };
        assert_eq!(size, 4096);
        assert_eq!(row.iter().sum::<u64>(), data(rank).len() as u64);
        // Pieces of (at most) 1500 bytes, each kept whole in a chunk of 4096.
        let (mut chunks, mut pos) = (1, 0);
        for piece in data(rank).chunks(1500) {
            if 4096 - pos < piece.len() {
                (chunks, pos) = (chunks + 1, 0);
            }
            pos += piece.len();
        }
        assert_eq!(count, chunks, "rank {rank}");
        assert_eq!(shoal_container_select_rank(s, rank as u64), 0);
        let mut got = vec![0u8; data(rank).len()];
        assert_eq!(shoal_container_fread(got.as_mut_ptr() as *mut c_void, 1, got.len(), s), got.len());
        assert_eq!(got, data(rank));
    }
    assert_eq!(shoal_container_close(s), 0);
}

#[test]
fn comms_are_freed_on_failures_and_bad_arguments_fail_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let name = CString::new(dir.path().join("c").to_str().unwrap()).unwrap();
    let (w, r, bad) = (CString::new("w").unwrap(), CString::new("r").unwrap(), CString::new("x").unwrap());
    let freed = Arc::new(AtomicUsize::new(0));
    tasks(2, &freed, |_, c| {
        // Bad arguments: before any communication, the comm freed all the same.
        let h = shoal_container_paropen(name.as_ptr(), bad.as_ptr(), 1, 1, 0, &c, std::ptr::null());
        assert!(h.is_null() && errno() == libc::EINVAL, "{}", last_error());
        assert!(last_error().contains("mode"));
    });
    assert_eq!(freed.swap(0, Ordering::SeqCst), 2);
    tasks(2, &freed, |_, mut c| {
        c.scatterv = None;
        let h = shoal_container_paropen(name.as_ptr(), w.as_ptr(), 1, 1, 0, &c, std::ptr::null());
        assert!(h.is_null() && errno() == libc::EINVAL && last_error().contains("scatterv"), "{}", last_error());
    });
    assert_eq!(freed.swap(0, Ordering::SeqCst), 2);
    // A container that does not exist: every task fails, with the reason from rank 0.
    tasks(3, &freed, |_, c| {
        let h = shoal_container_paropen(name.as_ptr(), r.as_ptr(), 0, 0, 0, &c, std::ptr::null());
        assert!(h.is_null(), "opened a missing container");
        assert!(last_error().contains("No such file"), "{}", last_error());
    });
    assert_eq!(freed.swap(0, Ordering::SeqCst), 3);

    let null = std::ptr::null_mut();
    assert!(shoal_container_paropen(name.as_ptr(), r.as_ptr(), 0, 0, 0, std::ptr::null(), std::ptr::null()).is_null());
    assert_eq!(errno(), libc::EFAULT);
    assert_eq!(shoal_container_fwrite(b"x".as_ptr() as *const c_void, 1, 1, null), 0);
    assert_eq!(errno(), libc::EFAULT);
    assert_eq!(shoal_container_feof(null), -1);
    assert_eq!(shoal_container_parclose(null), -1);
    assert_eq!(shoal_container_close(null), -1);
    assert!(shoal_container_open(name.as_ptr(), std::ptr::null()).is_null());
    assert_eq!(errno(), libc::ENOENT);
    // (Not changing the environment: other tests' threads may be reading it.)
    if std::env::var_os("SHOAL_CONFIG").is_none() {
        let shoal = CString::new("shoal://c").unwrap();
        assert!(shoal_container_open(shoal.as_ptr(), std::ptr::null()).is_null());
        assert!(errno() == libc::EINVAL && last_error().contains("SHOAL_CONFIG"), "{}", last_error());
    }
}

#[test]
fn a_serial_writer_keeps_each_tasks_position() {
    let dir = tempfile::tempdir().unwrap();
    let name = CString::new(dir.path().join("s").to_str().unwrap()).unwrap();
    let chunks = [100u64, 9000, 4096];
    let w = shoal_container_open_write(name.as_ptr(), 3, chunks.as_ptr(), 1, 0, std::ptr::null());
    assert!(!w.is_null(), "{}", last_error());
    for half in 0..2 {
        for r in 0..3 {
            let d = data(r);
            let part = &d[half * d.len() / 2..(half + 1) * d.len() / 2];
            assert_eq!(shoal_container_select_rank(w, r as u64), 0);
            assert_eq!(shoal_container_fwrite(part.as_ptr() as *const c_void, part.len(), 1, w), 1);
        }
    }
    assert_eq!(shoal_container_select_rank(w, 3), -1);
    assert_eq!(shoal_container_close(w), 0, "{}", last_error());
    for r in 0..3u64 {
        let one = shoal_container_open_rank(name.as_ptr(), r, std::ptr::null());
        assert!(!one.is_null(), "{}", last_error());
        let mut got = vec![0u8; 20000];
        let n = shoal_container_fread(got.as_mut_ptr() as *mut c_void, 1, got.len(), one);
        assert_eq!(&got[..n], &data(r as usize)[..]);
        assert_eq!(shoal_container_close(one), 0);
    }
}

#[test]
fn key_value_and_collective_calls_round_trip_through_the_c_api() {
    let dir = tempfile::tempdir().unwrap();
    let kv = CString::new(dir.path().join("kv").to_str().unwrap()).unwrap();
    let coll = CString::new(dir.path().join("coll").to_str().unwrap()).unwrap();
    let freed = Arc::new(AtomicUsize::new(0));
    let n = 4;
    let record = |rank: usize, key: u64, i: usize| vec![(rank * 16 + key as usize + i) as u8; 300 + 200 * i];
    let mode = |m: &str| CString::new(m).unwrap();
    tasks(n, &freed, |rank, c| {
        let h = shoal_container_paropen(kv.as_ptr(), mode("w,keyval").as_ptr(), 1000, 1, 4096, &c, std::ptr::null());
        assert!(!h.is_null(), "{}", last_error());
        // Keys 7 and 3 interleaved; records longer than a chunk run on into the next ones.
        for i in 0..4 {
            for key in [7u64, 3] {
                let r = record(rank, key, i);
                assert_eq!(shoal_container_fwrite_key(r.as_ptr() as *const c_void, key, 1, r.len(), h), r.len());
            }
        }
        assert_eq!(shoal_container_parclose(h), 0, "{}", last_error());
    });
    tasks(n, &freed, |rank, c| {
        let h = shoal_container_paropen(kv.as_ptr(), mode("r").as_ptr(), 0, 0, 0, &c, std::ptr::null());
        assert!(!h.is_null(), "{}", last_error());
        let mut keys = Vec::new();
        assert_eq!(shoal_container_key_list_reset(h), 0);
        let mut k = 0;
        while shoal_container_key_list_next(h, &mut k) == 1 {
            keys.push(k);
        }
        assert_eq!(keys, [3, 7]);
        let (mut records, mut bytes) = (0, 0);
        assert_eq!(shoal_container_key_stat(h, 7, &mut records, &mut bytes), 0);
        assert_eq!((records, bytes), (4, (0..4).map(|i| 300 + 200 * i as u64).sum()));
        // All of key 7 in one read, then record 2 of key 3 from byte 10.
        let want: Vec<u8> = (0..4).flat_map(|i| record(rank, 7, i)).collect();
        let mut got = vec![0u8; want.len() + 10];
        assert_eq!(shoal_container_fread_key(got.as_mut_ptr() as *mut c_void, 7, 1, got.len(), h), want.len());
        assert_eq!(&got[..want.len()], &want[..]);
        assert_eq!(shoal_container_seek_key(h, 3, 2, 10), 0);
        let mut part = vec![0u8; 20];
        assert_eq!(shoal_container_fread_key(part.as_mut_ptr() as *mut c_void, 3, 1, 20, h), 20);
        assert_eq!(part, record(rank, 3, 2)[10..30]);
        assert_eq!(shoal_container_seek_key(h, 3, 9, 0), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(shoal_container_parclose(h), 0, "{}", last_error());
    });
    // Collectors of 2 tasks: each group's chunks packed together, written by its first task.
    tasks(n, &freed, |rank, c| {
        let h =
            shoal_container_paropen(coll.as_ptr(), mode("w,collsize=2").as_ptr(), 1000, 1, 4096, &c, std::ptr::null());
        assert!(!h.is_null(), "{}", last_error());
        let d = &data(rank)[..1000];
        assert_eq!(shoal_container_coll_fwrite(d.as_ptr() as *const c_void, 10, 100, h), 100);
        assert_eq!(shoal_container_parclose(h), 0, "{}", last_error());
    });
    tasks(n, &freed, |rank, c| {
        let h = shoal_container_paropen(coll.as_ptr(), mode("r").as_ptr(), 0, 0, 0, &c, std::ptr::null());
        assert!(!h.is_null(), "{}", last_error());
        let mut got = vec![0u8; 1000];
        assert_eq!(shoal_container_coll_fread(got.as_mut_ptr() as *mut c_void, 10, 100, h), 100);
        assert_eq!(got, data(rank)[..1000]);
        // A key call on a container without keys fails, clearly.
        let mut k = 0;
        assert_eq!(shoal_container_key_list_next(h, &mut k), -1);
        assert_eq!(shoal_container_parclose(h), 0, "{}", last_error());
    });
    // 2 groups of 2 tasks: 1000 bytes each, packed; one block per group.
    let len = std::fs::metadata(dir.path().join("coll")).unwrap().len();
    assert!(len <= 4 * 4096, "coalesced container of {len} bytes");
    // Bad modes fail before any communication.
    tasks(1, &freed, |_, c| {
        let h = shoal_container_paropen(coll.as_ptr(), mode("w,collsize=x").as_ptr(), 1000, 1, 0, &c, std::ptr::null());
        assert!(h.is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(last_error().contains("collsize=x"), "{}", last_error());
    });
}
