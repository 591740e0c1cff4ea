//! Micro-checkpointing (docs/checkpoint.md): each task of a job saves its part of
//! checkpoint N when it is ready, and checkpoint N is committed by the servers once every
//! part is there. No task waits for another.
//!
//! A part is a file, `DIR/N.PART`, written and closed (acknowledged data survives `kill -9`
//! of any server), then recorded by the tuple `("checkpoint:NAME", N, PART, SIZE)`. That
//! tuple goes with an action (`tuple::Trigger`) that the server holding the name's tuples
//! runs in the same step as the write: when the parts of N reach the job's count and N is
//! not committed, it also writes `("checkpoint:NAME", "committed", N)`. The last part to
//! arrive commits, whichever task wrote it; a crash cannot separate a part from the commit
//! it completes, and a checkpoint is committed once.
//!
//! Restart reads the newest committed number. When every task saves its parts in order of
//! N (as a time-stepped job does), commits come in order of N too: N's parts are all
//! written before any task writes its part of N + 1, so the newest commit is the highest.

use crate::client::Client;
use crate::error::{Error, Result};
use shoal_proto::tuple::{Field, Template, Trigger, Tuple, Value, ValueKind};
use shoal_proto::Errno;
use std::time::Duration;

/// One job's checkpoints: `parts` tasks saving into `dir` under `name`.
#[derive(Clone)]
pub struct MicroCheckpoint {
    client: Client,
    name: String,
    dir: String,
    parts: u32,
}

impl MicroCheckpoint {
    /// The checkpoints of job `name` (any text), with `parts` parts each, kept in `dir`
    /// (made if missing, with its parents).
    pub async fn open(client: &Client, name: &str, dir: &str, parts: u32) -> Result<MicroCheckpoint> {
        if parts == 0 || name.is_empty() {
            return Err(Error::new(Errno::EINVAL, "a checkpoint needs a name and at least one part"));
        }
        client.mkdir_all(dir, 0o755).await?;
        Ok(MicroCheckpoint { client: client.clone(), name: name.to_string(), dir: dir.to_string(), parts })
    }

    /// Where part `part` of checkpoint `n` is kept.
    pub fn part_path(&self, n: u64, part: u32) -> String {
        format!("{}/{n}.{part}", self.dir.trim_end_matches('/'))
    }

    /// Save part `part` of checkpoint `n`: its file, then its tuple, which commits `n` when
    /// it is the last part missing. Saving a part again replaces it.
    pub async fn save(&self, n: u64, part: u32, data: &[u8]) -> Result<()> {
        if part >= self.parts {
            return Err(Error::new(Errno::EINVAL, format!("part {part} of a checkpoint of {} parts", self.parts)));
        }
        let f = self.client.create(&self.part_path(n, part), 0o644, None).await?;
        f.write_at(0, data).await?;
        f.close().await?;
        // A part saved again is counted once.
        let again = Template(vec![self.key_field(), int(n), int(part as u64), Field::AnyOf(ValueKind::Int)]);
        self.client.tuple_take(&again, Some(Duration::ZERO)).await?;
        let tuple =
            Tuple(vec![self.key(), Value::Int(n as i64), Value::Int(part as i64), Value::Int(data.len() as i64)]);
        let commit = Trigger {
            count: Template(vec![self.key_field(), int(n), Field::AnyOf(ValueKind::Int), Field::AnyOf(ValueKind::Int)]),
            reaches: self.parts,
            write: self.committed(n),
        };
        self.client.tuple_write_then(&tuple, Some(&commit)).await?;
        Ok(())
    }

    /// Whether checkpoint `n` is committed, waiting up to `wait` for it (`None`: until it
    /// is).
    pub async fn is_committed(&self, n: u64, wait: Option<Duration>) -> Result<bool> {
        Ok(self.client.tuple_read(&Template::exactly(&self.committed(n)), wait).await?.is_some())
    }

    /// The newest committed checkpoint, if any: where a restart starts from.
    pub async fn latest(&self) -> Result<Option<u64>> {
        let t =
            Template(vec![self.key_field(), Field::Is(Value::Str("committed".into())), Field::AnyOf(ValueKind::Int)]);
        match self.client.tuple_read_newest(&t, Some(Duration::ZERO)).await? {
            Some(Tuple(v)) => match v.get(2) {
                Some(Value::Int(n)) => Ok(Some(*n as u64)),
                _ => Err(Error::new(Errno::EIO, "a commit tuple without its number")),
            },
            None => Ok(None),
        }
    }

    /// Part `part` of checkpoint `n`, as saved.
    pub async fn load(&self, n: u64, part: u32) -> Result<Vec<u8>> {
        let path = self.part_path(n, part);
        let f = self.client.open(&path, crate::OpenFlags::read_only()).await?;
        let size = f.attr().size;
        let data = f.read_at(0, size as usize).await?;
        f.close().await?;
        Ok(data.to_vec())
    }

    fn key(&self) -> Value {
        Value::Str(format!("checkpoint:{}", self.name))
    }

    fn key_field(&self) -> Field {
        Field::Is(self.key())
    }

    fn committed(&self, n: u64) -> Tuple {
        Tuple(vec![self.key(), Value::Str("committed".into()), Value::Int(n as i64)])
    }
}

fn int(n: u64) -> Field {
    Field::Is(Value::Int(n as i64))
}
