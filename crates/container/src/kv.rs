//! Key-value logical files (SIONlib's key-value containers): a task writes records, each a
//! key and a piece of data, and reads back the data of one key at a time, in the order it
//! was written, as one stream per key.
//!
//! Records are stored inline in the task's logical file: a 16-byte record head (key, then
//! data length, both u64 little-endian) followed by the data; a record may run on into the
//! task's next chunk like any write. A reader scans the heads once, as far as it needs,
//! into an index (key → the records' positions), so looking a key up again costs nothing.

use crate::error::{Error, Result};
use crate::logical::Logical;
use std::collections::BTreeMap;

/// Bytes of a record head.
pub const RECORD_HEAD: u64 = 16;

/// A reader's knowledge of a key-value logical file.
#[derive(Default, Debug)]
pub(crate) struct KvIndex {
    /// Per key: each record's data position in the logical file and length, in order.
    records: BTreeMap<u64, Vec<(u64, u64)>>,
    /// Where the scan stopped (the head of the next record not indexed yet).
    scanned: u64,
    /// Per key: the record being read and the offset in it.
    cursors: BTreeMap<u64, (usize, u64)>,
}

impl Logical {
    fn require_kv(&self) -> Result<()> {
        if self.key_value {
            Ok(())
        } else {
            Err(Error::Usage("the container was not opened in key-value mode".into()))
        }
    }

    /// Write one record: `data` under `key`.
    pub async fn write_key(&mut self, key: u64, data: &[u8]) -> Result<()> {
        self.require_kv()?;
        let mut head = [0u8; RECORD_HEAD as usize];
        head[..8].copy_from_slice(&key.to_le_bytes());
        head[8..].copy_from_slice(&(data.len() as u64).to_le_bytes());
        self.write(&head).await?;
        self.write(data).await
    }

    /// Index records up to the end of the logical file, or until `until` says stop.
    async fn scan(&mut self, until: impl Fn(&KvIndex) -> bool) -> Result<()> {
        let end = self.chunks.len();
        while self.kv.scanned < end && !until(&self.kv) {
            let at = self.kv.scanned;
            self.seek_logical(at)?;
            let mut head = [0u8; RECORD_HEAD as usize];
            if self.read(&mut head).await? < head.len() {
                return Err(self.bad_record(at, "its head runs past the end"));
            }
            let key = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
            let len = u64::from_le_bytes(head[8..].try_into().expect("8 bytes"));
            let data_at = at + RECORD_HEAD;
            if len > end - data_at {
                return Err(self.bad_record(at, "its data runs past the end"));
            }
            self.kv.records.entry(key).or_default().push((data_at, len));
            self.kv.scanned = data_at + len;
        }
        Ok(())
    }

    fn bad_record(&self, at: u64, why: &str) -> Error {
        Error::Io {
            path: self.file.path().to_string(),
            errno: libc::EBADMSG,
            message: format!("rank {}: the key-value record at offset {at} is corrupt: {why}", self.chunks.slot.rank),
        }
    }

    /// Read up to `buf.len()` bytes of `key`'s data from where the last read of it (or
    /// `seek_key`) left off, across its records; 0 when none is left.
    pub async fn read_key(&mut self, key: u64, buf: &mut [u8]) -> Result<usize> {
        self.require_kv()?;
        let mut got = 0;
        while got < buf.len() {
            let (rec, off) = self.kv.cursors.get(&key).copied().unwrap_or((0, 0));
            let need = rec + 1;
            self.scan(|kv| kv.records.get(&key).is_some_and(|r| r.len() >= need)).await?;
            let Some(&(at, len)) = self.kv.records.get(&key).and_then(|r| r.get(rec)) else { break };
            if off >= len {
                self.kv.cursors.insert(key, (rec + 1, 0));
                continue;
            }
            let n = (len - off).min((buf.len() - got) as u64) as usize;
            self.seek_logical(at + off)?;
            let r = self.read(&mut buf[got..got + n]).await?;
            if r < n {
                return Err(self.bad_record(at - RECORD_HEAD, "its data is cut short"));
            }
            got += n;
            self.kv.cursors.insert(key, (rec, off + n as u64));
        }
        Ok(got)
    }

    /// Place `key`'s read position at offset `pos` of its record number `entry` (from 0).
    pub async fn seek_key(&mut self, key: u64, entry: usize, pos: u64) -> Result<()> {
        self.require_kv()?;
        self.scan(|kv| kv.records.get(&key).is_some_and(|r| r.len() > entry)).await?;
        let len = self
            .kv
            .records
            .get(&key)
            .and_then(|r| r.get(entry))
            .map(|&(_, l)| l)
            .ok_or_else(|| Error::Usage(format!("key {key} has no record {entry}")))?;
        if pos > len {
            return Err(Error::Usage(format!(
                "offset {pos} is past the end of record {entry} of key {key} ({len} bytes)"
            )));
        }
        self.kv.cursors.insert(key, (entry, pos));
        Ok(())
    }

    /// Every key with the lengths of its records, in key order (scans the whole file).
    pub async fn keys(&mut self) -> Result<Vec<(u64, Vec<u64>)>> {
        self.require_kv()?;
        self.scan(|_| false).await?;
        Ok(self.kv.records.iter().map(|(k, r)| (*k, r.iter().map(|&(_, l)| l).collect())).collect())
    }

    /// All of `key`'s data, every record in order (from its start, whatever was read).
    pub async fn read_key_all(&mut self, key: u64) -> Result<Vec<u8>> {
        let lens: u64 = self.keys().await?.into_iter().find(|(k, _)| *k == key).map_or(0, |(_, r)| r.iter().sum());
        self.kv.cursors.insert(key, (0, 0));
        let mut buf = vec![0; lens as usize];
        let n = self.read_key(key, &mut buf).await?;
        buf.truncate(n);
        Ok(buf)
    }
}
