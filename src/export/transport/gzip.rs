//! gzip for OTLP/HTTP bodies (`Content-Encoding: gzip`), with the deflate state kept between
//! requests: a compressor's window and hash tables are a few hundred KiB that would otherwise be
//! allocated and zeroed for every request (each export window's, each retry's). The output is a
//! standard gzip member (RFC 1952: a 10-byte header without name or time, the raw deflate
//! stream, CRC-32 and length), which any OTLP receiver inflates.

use std::io;
use std::sync::Mutex;

use flate2::{Compress, Compression, Crc, FlushCompress, Status};

/// The header of a gzip member: magic, deflate, no flags, no modification time, no extra
/// flags, unknown OS.
const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

/// A gzip compressor shared by the clones of one transport.
pub(super) struct Gzip {
    /// Taken by one request at a time; a request that finds it taken (another lane compressing
    /// at the same moment) uses a compressor of its own instead of waiting.
    deflate: Mutex<Compress>,
}

impl std::fmt::Debug for Gzip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gzip")
    }
}

impl Gzip {
    pub(super) fn new() -> Self {
        Self {
            deflate: Mutex::new(raw_deflate()),
        }
    }

    /// `body` as one gzip member.
    pub(super) fn compress(&self, body: &[u8]) -> io::Result<Vec<u8>> {
        match self.deflate.try_lock() {
            Ok(mut deflate) => gzip_with(&mut deflate, body),
            Err(_) => gzip_with(&mut raw_deflate(), body),
        }
    }
}

fn raw_deflate() -> Compress {
    Compress::new(Compression::default(), false)
}

fn gzip_with(deflate: &mut Compress, body: &[u8]) -> io::Result<Vec<u8>> {
    deflate.reset();
    // A quarter of the body is about what OTLP metrics compress to; the loop grows it if not.
    let mut out = Vec::with_capacity(HEADER.len() + body.len() / 4 + 64);
    out.extend_from_slice(&HEADER);
    loop {
        if out.capacity() - out.len() < 64 {
            out.reserve(out.capacity());
        }
        let consumed = usize::try_from(deflate.total_in()).unwrap_or(usize::MAX);
        let status = deflate
            .compress_vec(&body[consumed..], &mut out, FlushCompress::Finish)
            .map_err(io::Error::other)?;
        if status == Status::StreamEnd {
            break;
        }
    }
    let mut crc = Crc::new();
    crc.update(body);
    out.extend_from_slice(&crc.sum().to_le_bytes());
    // ISIZE: the length modulo 2^32, as RFC 1952 defines it.
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;

    fn gunzip(packed: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(packed)
            .read_to_end(&mut out)
            .expect("a valid gzip member");
        out
    }

    /// The kept compressor starts each body afresh: bodies of different sizes, one after the
    /// other (an empty one, one that outgrows the first guess of the output's size, the same
    /// again), each inflate back to themselves with a correct CRC and length.
    #[test]
    fn bodies_compressed_one_after_the_other_each_inflate_to_themselves() {
        let gzip = Gzip::new();
        let text = b"metrics metrics metrics metrics".repeat(50);
        // Bytes that do not compress: the output outgrows a quarter of the input.
        let noise: Vec<u8> = (0u32..200_000)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for body in [&text[..], &[][..], &noise[..], &text[..], &noise[..]] {
            let packed = gzip.compress(body).unwrap();
            assert_eq!(gunzip(&packed), body);
        }
        let packed = gzip.compress(&text).unwrap();
        assert!(packed.len() < text.len() / 10, "{} bytes", packed.len());
    }

    /// The same bytes as flate2's own `GzEncoder` writes at the same level, header aside (its
    /// header names the OS; ours says unknown).
    #[test]
    fn the_deflate_stream_is_flate2s() {
        use std::io::Write as _;
        let body = b"gpu.utilization hw.id GPU-0 ".repeat(400);
        let mut reference = flate2::write::GzEncoder::new(Vec::new(), Compression::default());
        reference.write_all(&body).unwrap();
        let reference = reference.finish().unwrap();
        let ours = Gzip::new().compress(&body).unwrap();
        assert_eq!(ours[10..], reference[10..]);
    }
}
