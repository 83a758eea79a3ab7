//! The value of an idempotency record in a store without a TTL the reader can see (etcd,
//! ZooKeeper): a kind byte (`R` result, `M` mark), the expiry in Unix milliseconds (8 bytes,
//! big endian), the fingerprint's length (4 bytes, big endian), the fingerprint, then the
//! result or the mark's id. The expiry is the writer's clock plus the TTL: a reader counts
//! what is left against its own clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) const RESULT: u8 = b'R';
pub(crate) const MARK: u8 = b'M';

/// A record read back.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) kind: u8,
    pub(crate) fingerprint: String,
    pub(crate) payload: Vec<u8>,
    pub(crate) expires_in: Duration,
}

pub(crate) fn encode(kind: u8, ttl: Duration, fingerprint: &str, payload: &[u8]) -> Vec<u8> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let expiry = u64::try_from(now.saturating_add(ttl).as_millis()).unwrap_or(u64::MAX);
    let fp_len = u32::try_from(fingerprint.len()).unwrap_or(u32::MAX);
    let mut value = Vec::with_capacity(13 + fingerprint.len() + payload.len());
    value.push(kind);
    value.extend_from_slice(&expiry.to_be_bytes());
    value.extend_from_slice(&fp_len.to_be_bytes());
    value.extend_from_slice(fingerprint.as_bytes());
    value.extend_from_slice(payload);
    value
}

/// `None` for a value this backend did not write.
pub(crate) fn decode(value: &[u8]) -> Option<Record> {
    let (&kind, rest) = value.split_first()?;
    if kind != RESULT && kind != MARK {
        return None;
    }
    let (expiry, rest) = rest.split_first_chunk::<8>()?;
    let (fp_len, rest) = rest.split_first_chunk::<4>()?;
    let fp_len = usize::try_from(u32::from_be_bytes(*fp_len)).ok()?;
    if rest.len() < fp_len {
        return None;
    }
    let (fingerprint, payload) = rest.split_at(fp_len);
    let expiry = Duration::from_millis(u64::from_be_bytes(*expiry));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Some(Record {
        kind,
        fingerprint: String::from_utf8(fingerprint.to_vec()).ok()?,
        payload: payload.to_vec(),
        expires_in: expiry.saturating_sub(now),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_garbage_is_refused() {
        let value = encode(RESULT, Duration::from_secs(60), "fp", &[0, 255]);
        let record = decode(&value).unwrap();
        assert_eq!(record.kind, RESULT);
        assert_eq!(record.fingerprint, "fp");
        assert_eq!(record.payload, vec![0, 255]);
        assert!(record.expires_in > Duration::from_secs(58));
        for bad in [&b""[..], b"X", b"R123", &value[..12]] {
            assert_eq!(decode(bad), None);
        }
    }
}
