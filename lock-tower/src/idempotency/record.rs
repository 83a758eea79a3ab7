//! The stored form of a response: a small versioned binary format.
//!
//! ```text
//! "LTIR" | version: u8 = 1 or 2 | kind: u8
//! kind 1 (a response):   status: u16 | fields (its headers) | body_len: u32 | body
//!                        version 2 only: | fields (its trailers)
//! kind 2 (not stored):   status: u16   (the response was too large to store)
//! fields:                count: u16 | per field: name_len: u16, name, value_len: u32, value
//! ```
//!
//! A response without trailers is written as version 1, which every version reads; version 2
//! (issue 29, item 12) adds the trailers. Integers are big-endian. Decoding checks every
//! length and every name and value, and refuses trailing bytes: garbage is an error, never a
//! panic.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

const MAGIC: &[u8; 4] = b"LTIR";
/// Records without trailers.
const VERSION: u8 = 1;
/// Records with trailers.
const VERSION_TRAILERS: u8 = 2;
const KIND_RESPONSE: u8 = 1;
const KIND_TOO_LARGE: u8 = 2;

/// What a record holds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[expect(
    clippy::large_enum_variant,
    reason = "one short-lived value per stored or replayed response: boxing would cost the common variant an allocation"
)]
pub(crate) enum Stored {
    /// The response, to replay.
    Response {
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
        /// Sent after the body; empty when it had none.
        trailers: HeaderMap,
    },
    /// The first request ran and answered `status`, but its response was too large to store.
    TooLarge { status: StatusCode },
}

/// Why a record could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecodeError(pub(crate) &'static str);

impl Stored {
    /// The encoded record; `None` when a header or the body does not fit the format.
    pub(crate) fn encode(&self) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        match self {
            Stored::Response {
                status,
                headers,
                body,
                trailers,
            } => {
                out.push(match trailers.is_empty() {
                    true => VERSION,
                    false => VERSION_TRAILERS,
                });
                out.push(KIND_RESPONSE);
                out.extend_from_slice(&status.as_u16().to_be_bytes());
                put_fields(&mut out, headers)?;
                out.extend_from_slice(&u32::try_from(body.len()).ok()?.to_be_bytes());
                out.extend_from_slice(body);
                if !trailers.is_empty() {
                    put_fields(&mut out, trailers)?;
                }
            }
            Stored::TooLarge { status } => {
                out.push(VERSION);
                out.push(KIND_TOO_LARGE);
                out.extend_from_slice(&status.as_u16().to_be_bytes());
            }
        }
        Some(out)
    }

    /// Reads a record written by [`encode`](Self::encode).
    pub(crate) fn decode(bytes: &[u8]) -> Result<Stored, DecodeError> {
        let mut r = Reader(bytes);
        if r.take(4)? != MAGIC {
            return Err(DecodeError("not a lock-tower idempotency record"));
        }
        let version = r.u8()?;
        if version != VERSION && version != VERSION_TRAILERS {
            return Err(DecodeError("unknown record version"));
        }
        let kind = r.u8()?;
        let status = StatusCode::from_u16(r.u16()?).map_err(|_| DecodeError("bad status"))?;
        let stored = match kind {
            KIND_RESPONSE => {
                let headers = r.fields()?;
                let len = r.len32()?;
                let body = Bytes::copy_from_slice(r.take(len)?);
                let trailers = match version {
                    VERSION_TRAILERS => r.fields()?,
                    _ => HeaderMap::new(),
                };
                Stored::Response {
                    status,
                    headers,
                    body,
                    trailers,
                }
            }
            KIND_TOO_LARGE if version == VERSION => Stored::TooLarge { status },
            _ => return Err(DecodeError("unknown record kind")),
        };
        if !r.0.is_empty() {
            return Err(DecodeError("trailing bytes"));
        }
        Ok(stored)
    }
}

/// Writes `fields` (headers or trailers) as the format's field list; `None` when one does not
/// fit.
fn put_fields(out: &mut Vec<u8>, fields: &HeaderMap) -> Option<()> {
    out.extend_from_slice(&u16::try_from(fields.len()).ok()?.to_be_bytes());
    for (name, value) in fields {
        let name = name.as_str().as_bytes();
        out.extend_from_slice(&u16::try_from(name.len()).ok()?.to_be_bytes());
        out.extend_from_slice(name);
        let value = value.as_bytes();
        out.extend_from_slice(&u32::try_from(value.len()).ok()?.to_be_bytes());
        out.extend_from_slice(value);
    }
    Some(())
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError("truncated record"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// A field list written by [`put_fields`].
    fn fields(&mut self) -> Result<HeaderMap, DecodeError> {
        let count = self.u16()?;
        let mut fields = HeaderMap::with_capacity(usize::from(count).min(64));
        for _ in 0..count {
            let len = usize::from(self.u16()?);
            let name = HeaderName::from_bytes(self.take(len)?)
                .map_err(|_| DecodeError("bad header name"))?;
            let len = self.len32()?;
            let value = HeaderValue::from_bytes(self.take(len)?)
                .map_err(|_| DecodeError("bad header value"))?;
            fields.append(name, value);
        }
        Ok(fields)
    }

    fn len32(&mut self) -> Result<usize, DecodeError> {
        let b = self.take(4)?;
        usize::try_from(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            .map_err(|_| DecodeError("length out of range"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Stored {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.append("set-cookie", HeaderValue::from_static("a=1"));
        headers.append("set-cookie", HeaderValue::from_static("b=2"));
        Stored::Response {
            status: StatusCode::CREATED,
            headers,
            body: Bytes::from_static(b"{\"id\":1}\x00\xff"),
            trailers: HeaderMap::new(),
        }
    }

    fn with_trailers() -> Stored {
        let Stored::Response {
            status,
            headers,
            body,
            ..
        } = sample()
        else {
            unreachable!()
        };
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        trailers.append("x-sum", HeaderValue::from_static("1"));
        trailers.append("x-sum", HeaderValue::from_static("2"));
        Stored::Response {
            status,
            headers,
            body,
            trailers,
        }
    }

    #[test]
    fn round_trips() {
        for stored in [
            sample(),
            with_trailers(),
            Stored::TooLarge {
                status: StatusCode::OK,
            },
        ] {
            let bytes = stored.encode().unwrap();
            assert_eq!(Stored::decode(&bytes).unwrap(), stored);
        }
    }

    /// A record of the first format (version 1, written before trailers were kept) still
    /// reads; a response without trailers is still written that way, so processes of the
    /// previous version read it too.
    #[test]
    fn version_1_records_still_read_and_are_still_written_without_trailers() {
        let mut v1 = b"LTIR\x01\x01\x00\xc9\x00\x01".to_vec();
        v1.extend_from_slice(b"\x00\x0ccontent-type\x00\x00\x00\x0atext/plain");
        v1.extend_from_slice(b"\x00\x00\x00\x02ok");
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("text/plain"));
        let expected = Stored::Response {
            status: StatusCode::CREATED,
            headers,
            body: Bytes::from_static(b"ok"),
            trailers: HeaderMap::new(),
        };
        assert_eq!(Stored::decode(&v1).unwrap(), expected);
        assert_eq!(expected.encode().unwrap(), v1);
        assert_eq!(with_trailers().encode().unwrap()[4], 2);
        // A version 1 record has no trailers after its body.
        let mut v1_trailing = with_trailers().encode().unwrap();
        v1_trailing[4] = 1;
        assert!(Stored::decode(&v1_trailing).is_err());
    }

    #[test]
    fn garbage_is_an_error_never_a_panic() {
        for good in [sample(), with_trailers()] {
            garbage(good.encode().unwrap());
        }
    }

    fn garbage(good: Vec<u8>) {
        // Every truncation, every single-byte change, trailing bytes, random-ish input.
        for len in 0..good.len() {
            assert!(Stored::decode(&good[..len]).is_err(), "truncated at {len}");
        }
        for i in 0..good.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut bad = good.clone();
                bad[i] ^= flip;
                let _ = Stored::decode(&bad);
            }
        }
        let mut long = good.clone();
        long.push(0);
        assert!(Stored::decode(&long).is_err());
        let mut seed = 0x2545_f491_u32;
        for n in 0..2000 {
            let bytes: Vec<u8> = (0..n % 64)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 17;
                    seed ^= seed << 5;
                    seed.to_be_bytes()[0]
                })
                .collect();
            let _ = Stored::decode(&bytes);
            for version in [1, 2] {
                let mut framed = vec![b'L', b'T', b'I', b'R', version, 1];
                framed.extend_from_slice(&bytes);
                let _ = Stored::decode(&framed);
            }
        }
        assert!(Stored::decode(b"LTIR\x02\x01\x00\xc8").is_err());
        assert!(Stored::decode(b"LTIR\x03\x02\x00\xc8").is_err());
        assert!(Stored::decode(b"LTIR\x02\x02\x00\xc8").is_err());
        assert!(Stored::decode(b"LTIR\x01\x09\x00\xc8").is_err());
    }
}
