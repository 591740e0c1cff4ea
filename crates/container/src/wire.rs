//! Little-endian encoding of what tasks exchange through the communication layer (not
//! stored: the stored format is `format.rs`).

use crate::error::{Error, Result};

#[derive(Default)]
pub struct Enc(Vec<u8>);

impl Enc {
    pub fn u32(&mut self, v: u32) -> &mut Enc {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Enc {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u64s(&mut self, v: &[u64]) -> &mut Enc {
        self.u64(v.len() as u64);
        for &x in v {
            self.u64(x);
        }
        self
    }

    pub fn bytes(&mut self, v: &[u8]) -> &mut Enc {
        self.u64(v.len() as u64);
        self.0.extend_from_slice(v);
        self
    }

    pub fn done(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0)
    }
}

pub struct Dec<'a>(&'a [u8]);

impl<'a> Dec<'a> {
    pub fn new(b: &'a [u8]) -> Dec<'a> {
        Dec(b)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(Error::Comm("a message between tasks is cut short (tasks of different versions?)".into()));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }

    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    pub fn u64s(&mut self) -> Result<Vec<u64>> {
        let n = self.u64()? as usize;
        if n > self.0.len() / 8 {
            return Err(Error::Comm("a message between tasks is cut short".into()));
        }
        (0..n).map(|_| self.u64()).collect()
    }

    pub fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u64()? as usize;
        self.take(n)
    }
}
