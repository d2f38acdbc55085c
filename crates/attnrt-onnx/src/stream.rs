//! A [`BufMut`] over a writer, so that prost encodes a model straight into a file: small fields
//! gather in a bounded buffer, large ones (tensor data) go to the writer as they are, and the
//! pages of a mapped file they came from are given back once written ([`crate::mapped::release`]).

use std::io::Write;

use bytes::buf::UninitSlice;
use bytes::BufMut;

/// Bytes gathered before they are written.
const BUFFER: usize = 256 << 10;

/// Encodes into `inner` through a buffer of 256 KiB. prost's encoding cannot fail on
/// its own, so the first write error is kept and returned by [`WriteBuf::finish`]; nothing is
/// written after it.
pub struct WriteBuf<'a> {
    inner: &'a mut dyn Write,
    buf: Vec<u8>,
    error: Option<std::io::Error>,
}

impl<'a> WriteBuf<'a> {
    /// An empty buffer in front of `inner`.
    pub fn new(inner: &'a mut dyn Write) -> Self {
        WriteBuf {
            inner,
            buf: Vec::with_capacity(BUFFER),
            error: None,
        }
    }

    /// Writes what is buffered; the first error of any write so far.
    pub fn finish(mut self) -> std::io::Result<()> {
        self.flush_buffer();
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn write(&mut self, data: &[u8]) {
        if self.error.is_none() {
            if let Err(e) = self.inner.write_all(data) {
                self.error = Some(e);
            }
        }
    }

    fn flush_buffer(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        self.write(&buf);
        self.buf = buf;
        self.buf.clear();
    }
}

// Safety: `chunk_mut` hands out the vector's spare capacity, and `advance_mut` only counts
// bytes the caller has initialised there (as `BufMut` requires of its callers).
unsafe impl BufMut for WriteBuf<'_> {
    fn remaining_mut(&self) -> usize {
        usize::MAX - self.buf.len()
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        let len = self.buf.len() + cnt;
        assert!(len <= self.buf.capacity(), "advance past the buffer");
        self.buf.set_len(len);
        if self.buf.len() == self.buf.capacity() {
            self.flush_buffer();
        }
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        if self.buf.len() == self.buf.capacity() {
            self.flush_buffer();
        }
        UninitSlice::uninit(self.buf.spare_capacity_mut())
    }

    // prost writes a `Bytes` field with `put`, whose default copies through `chunk_mut`: here
    // each chunk of it goes to `put_slice` instead, so tensor data is written as it is.
    fn put<T: bytes::Buf>(&mut self, mut src: T)
    where
        Self: Sized,
    {
        while src.has_remaining() {
            let chunk = src.chunk();
            let n = chunk.len();
            self.put_slice(chunk);
            src.advance(n);
        }
    }

    fn put_slice(&mut self, src: &[u8]) {
        if src.len() >= BUFFER {
            self.flush_buffer();
            self.write(src);
            // Tensor data, written: a mapped model's pages of it are not needed any more.
            crate::mapped::release(src);
            return;
        }
        if self.buf.capacity() - self.buf.len() < src.len() {
            self.flush_buffer();
        }
        self.buf.extend_from_slice(src);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{GraphProto, ModelProto, TensorProto};
    use prost::Message;

    #[test]
    fn streams_the_same_bytes_as_encode_to_vec() {
        let big = TensorProto {
            name: "w".into(),
            raw_data: (0..BUFFER * 2 + 7)
                .map(|i| i as u8)
                .collect::<Vec<u8>>()
                .into(),
            ..Default::default()
        };
        let small = TensorProto {
            name: "s".into(),
            raw_data: vec![1, 2, 3].into(),
            ..Default::default()
        };
        let model = ModelProto {
            ir_version: 8,
            graph: Some(GraphProto {
                initializer: vec![small.clone(), big, small],
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut out = Vec::new();
        let mut w = WriteBuf::new(&mut out);
        model.encode(&mut w).unwrap();
        w.finish().unwrap();
        assert_eq!(out, model.encode_to_vec());
    }

    #[test]
    fn a_write_error_is_returned() {
        struct Full;
        impl Write for Full {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::Error::other("disk full"))
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut full = Full;
        let mut w = WriteBuf::new(&mut full);
        w.put_slice(&[0u8; 10]);
        assert!(w.finish().unwrap_err().to_string().contains("disk full"));
    }
}
