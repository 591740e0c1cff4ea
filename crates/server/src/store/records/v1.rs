//! Format 1, read-only: values were byte 1 + bincode 1 (fixed-width little-endian integers,
//! `u64` lengths, `u8` option and bool tags, `u32` variant indexes) of the records of that
//! time, which held wire types. Frozen: it describes stores already written (see
//! docs/formats.md, "Format 1").

use super::*;

/// A cursor over a format-1 value (after its leading byte).
struct Rd<'a> {
    b: &'a [u8],
}

type D<T> = Result<T, String>;

impl<'a> Rd<'a> {
    fn take(&mut self, n: usize) -> D<&'a [u8]> {
        if self.b.len() < n {
            return Err(format!("ends early ({} bytes left, {n} needed)", self.b.len()));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self) -> D<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> D<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> D<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn i64(&mut self) -> D<i64> {
        Ok(self.u64()? as i64)
    }
    fn bool(&mut self) -> D<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(format!("bool byte {b}")),
        }
    }
    fn len(&mut self) -> D<usize> {
        let n = self.u64()?;
        if n > self.b.len() as u64 {
            return Err(format!("length {n} beyond the value"));
        }
        Ok(n as usize)
    }
    fn string(&mut self) -> D<String> {
        let n = self.len()?;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| "string is not UTF-8".to_string())
    }
    fn opt<T>(&mut self, f: impl FnOnce(&mut Self) -> D<T>) -> D<Option<T>> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(f(self)?)),
            b => Err(format!("option tag {b}")),
        }
    }
    fn ino(&mut self) -> D<Ino> {
        Ok(Ino(self.u64()?))
    }
    fn kind(&mut self) -> D<FileKind> {
        match self.u32()? {
            0 => Ok(FileKind::File),
            1 => Ok(FileKind::Dir),
            2 => Ok(FileKind::Symlink),
            v => Err(format!("file kind {v}")),
        }
    }
    fn time(&mut self) -> D<Timestamp> {
        Ok(Timestamp { secs: self.i64()?, nsecs: self.u32()? })
    }
    fn layout(&mut self) -> D<Layout> {
        let stripe_size = self.u64()?;
        let n = self.u64()?;
        if n > self.b.len() as u64 / 4 {
            return Err(format!("{n} servers beyond the value"));
        }
        let servers = (0..n).map(|_| self.u32().map(ServerId)).collect::<D<_>>()?;
        // Formats 1 and 2 knew one copy only.
        Ok(Layout { stripe_size, servers, replicas: 1 })
    }
    fn spec(&mut self) -> D<LayoutSpec> {
        Ok(LayoutSpec {
            stripe_size: self.opt(Self::u64)?,
            stripe_count: self.opt(Self::u32)?,
            first_server: self.opt(|r| r.u32().map(ServerId))?,
            policy: self.opt(|r| match r.u32()? {
                0 => Ok(PlacementPolicy::Same),
                1 => Ok(PlacementPolicy::Spread),
                v => Err(format!("placement policy {v}")),
            })?,
            replicas: None,
        })
    }
    fn done<T>(self, v: T) -> D<T> {
        match self.b.len() {
            0 => Ok(v),
            n => Err(format!("{n} bytes after the record")),
        }
    }
}

/// Decode a format-1 value (leading byte included) with `f`.
fn decode<T>(bytes: &[u8], f: impl FnOnce(&mut Rd) -> D<T>) -> D<T> {
    match bytes.split_first() {
        Some((&VALUE_BINCODE1, rest)) => {
            let mut r = Rd { b: rest };
            let v = f(&mut r)?;
            r.done(v)
        }
        Some((b, _)) => Err(format!("value format byte {b}, not 1")),
        None => Err("empty value".into()),
    }
}

pub fn inode(bytes: &[u8]) -> D<InodeRecord> {
    decode(bytes, |r| {
        Ok(InodeRecord {
            kind: r.kind()?,
            perm: r.u32()?,
            uid: r.u32()?,
            gid: r.u32()?,
            size: r.u64()?,
            nlink: r.u32()?,
            atime: r.time()?,
            mtime: r.time()?,
            ctime: r.time()?,
            layout: r.opt(Rd::layout)?,
            dir_default: r.opt(Rd::spec)?,
            parent: r.opt(Rd::ino)?,
            target: r.opt(Rd::string)?,
            bitmap: Vec::new(),
            read_mostly: false,
        })
    })
}

pub fn entry(bytes: &[u8]) -> D<EntryRecord> {
    decode(bytes, |r| Ok(EntryRecord { ino: r.ino()?, kind: r.kind()? }))
}

pub fn intent(bytes: &[u8]) -> D<IntentRecord> {
    decode(bytes, |r| {
        let created = r.i64()?;
        let intent = match r.u32()? {
            0 => Intent::Mkdir { dir: r.ino()?, name: r.string()?, ino: r.ino()? },
            1 => Intent::Link { dir: r.ino()?, name: r.string()?, ino: r.ino()?, kind: r.kind()? },
            2 => Intent::Unlink { ino: r.ino()? },
            3 => Intent::Rmdir { dir: r.ino()?, name: r.string()?, ino: r.ino()? },
            4 => Intent::Rename {
                src_dir: r.ino()?,
                src_name: r.string()?,
                dst_dir: r.ino()?,
                dst_name: r.string()?,
                ino: r.ino()?,
                kind: r.kind()?,
                noreplace: r.bool()?,
            },
            5 => Intent::SetParent { ino: r.ino()?, parent: r.ino()? },
            6 => Intent::UnlinkKeep { ino: r.ino()?, session: r.u64()? },
            v => return Err(format!("intent variant {v}")),
        };
        Ok(IntentRecord { created, intent, reply_to: None })
    })
}

/// `Reply` variant indexes of format 1 for the replies peer steps kept.
const REPLY_OK: u32 = 1;
const REPLY_NLINK: u32 = 10;
const REPLY_REPLACED: u32 = 11;

pub fn applied(bytes: &[u8]) -> D<AppliedRecord> {
    decode(bytes, |r| {
        let created = r.i64()?;
        let reply = match r.u32()? {
            REPLY_OK => AppliedReply::Ok,
            REPLY_NLINK => AppliedReply::NLink { nlink: r.u32()? },
            REPLY_REPLACED => AppliedReply::Replaced {
                entry: r.opt(|r| Ok(DirEntry { name: r.string()?, ino: Ino(r.u64()?), kind: r.kind()? }))?,
            },
            v => return Err(format!("reply variant {v}, which no peer step keeps")),
        };
        Ok(AppliedRecord { created, reply })
    })
}

pub fn gc(bytes: &[u8]) -> D<GcRecord> {
    decode(bytes, |r| Ok(GcRecord { created: r.i64()?, layout: r.layout()? }))
}

pub fn orphan(bytes: &[u8]) -> D<OrphanRecord> {
    decode(bytes, |r| Ok(OrphanRecord { session: r.u64()?, since: r.i64()? }))
}
