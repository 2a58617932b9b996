//! The physical space (§6.1): a 64-bit address space common to every
//! endpoint, cut into 4 GiB chunks. Each chunk has one manager (its chunk
//! manager); an endpoint allocates the regions it creates (file blocks,
//! process pages) in chunks it manages, so every endpoint can tell any
//! region's manager from its address. Allocations and reclaims are announced
//! with `CHUNK_NOTICE`.

use std::collections::BTreeMap;

use crate::msg::Msg;
use crate::types::{Endpoint, ObjectId};

/// Bytes of one chunk of the physical space.
pub const CHUNK_BYTES: u64 = 1 << 32;
/// Bytes of one region (the unit of coherence for file data and memory).
pub const REGION_BYTES: u64 = 64 * 1024;

/// Why an allocation or a notice was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpaceError {
    #[error("the physical space is full (all {0} chunks allocated)")]
    Full(u64),
    #[error("chunk {chunk} is managed by {by}, not {claimed}")]
    Conflict {
        chunk: u32,
        by: Endpoint,
        claimed: Endpoint,
    },
}

/// One endpoint's table of chunk managers and its own bump allocator.
#[derive(Debug, Clone)]
pub struct Space {
    me: Endpoint,
    managers: BTreeMap<u32, Endpoint>,
    /// The chunk this endpoint allocates in, and the next free offset in it.
    current: Option<(u32, u64)>,
}

impl Space {
    /// The table of endpoint `me`; chunk 0 is never used (address 0 is no region).
    #[must_use]
    pub fn new(me: Endpoint) -> Self {
        Space {
            me,
            managers: BTreeMap::new(),
            current: None,
        }
    }

    /// The manager of the chunk holding `addr`.
    #[must_use]
    pub fn manager_of(&self, addr: ObjectId) -> Option<Endpoint> {
        u32::try_from(addr.0 / CHUNK_BYTES)
            .ok()
            .and_then(|c| self.managers.get(&c).copied())
    }

    /// Allocates `regions` consecutive regions in a chunk this endpoint
    /// manages; the notices to send every other endpoint when a new chunk was
    /// taken.
    pub fn allocate(&mut self, regions: u64) -> Result<(ObjectId, Vec<Msg>), SpaceError> {
        let bytes = regions.max(1) * REGION_BYTES;
        let mut notices = Vec::new();
        let fits = self
            .current
            .is_some_and(|(_, next)| next + bytes <= CHUNK_BYTES);
        if !fits {
            let chunk = (1..=u32::MAX)
                .find(|c| !self.managers.contains_key(c))
                .ok_or(SpaceError::Full(u64::from(u32::MAX)))?;
            self.managers.insert(chunk, self.me);
            self.current = Some((chunk, 0));
            notices.push(Msg::ChunkNotice {
                chunk,
                manager: Some(self.me),
            });
        }
        let Some((chunk, next)) = self.current.as_mut() else {
            return Err(SpaceError::Full(0));
        };
        let addr = u64::from(*chunk) * CHUNK_BYTES + *next;
        *next += bytes;
        Ok((ObjectId(addr), notices))
    }

    /// Applies another endpoint's `CHUNK_NOTICE`.
    pub fn notice(&mut self, chunk: u32, manager: Option<Endpoint>) -> Result<(), SpaceError> {
        match (self.managers.get(&chunk), manager) {
            (Some(by), Some(claimed)) if *by != claimed && *by == self.me => {
                Err(SpaceError::Conflict {
                    chunk,
                    by: *by,
                    claimed,
                })
            }
            (_, Some(m)) => {
                self.managers.insert(chunk, m);
                Ok(())
            }
            (_, None) => {
                self.managers.remove(&chunk);
                if self.current.is_some_and(|(c, _)| c == chunk) {
                    self.current = None;
                }
                Ok(())
            }
        }
    }

    /// Reclaims a chunk this endpoint manages (its regions were remapped);
    /// the notice to send.
    pub fn reclaim(&mut self, chunk: u32) -> Option<Msg> {
        (self.managers.get(&chunk) == Some(&self.me)).then(|| {
            self.managers.remove(&chunk);
            if self.current.is_some_and(|(c, _)| c == chunk) {
                self.current = None;
            }
            Msg::ChunkNotice {
                chunk,
                manager: None,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_name_their_manager_on_every_endpoint() {
        let (a, b) = (Endpoint(1), Endpoint(2));
        let mut sa = Space::new(a);
        let mut sb = Space::new(b);
        let (ra, na) = sa.allocate(3).unwrap();
        for n in na {
            let Msg::ChunkNotice { chunk, manager } = n else {
                panic!()
            };
            sb.notice(chunk, manager).unwrap();
        }
        let (rb, nb) = sb.allocate(1).unwrap();
        for n in nb {
            let Msg::ChunkNotice { chunk, manager } = n else {
                panic!()
            };
            sa.notice(chunk, manager).unwrap();
        }
        assert_ne!(ra.0 / CHUNK_BYTES, rb.0 / CHUNK_BYTES);
        assert_eq!(sb.manager_of(ra), Some(a));
        assert_eq!(sa.manager_of(rb), Some(b));
        let (ra2, more) = sa.allocate(1).unwrap();
        assert!(more.is_empty());
        assert_eq!(ra2.0, ra.0 + 3 * REGION_BYTES);
        let Some(Msg::ChunkNotice {
            chunk,
            manager: None,
        }) = sa.reclaim((ra.0 / CHUNK_BYTES) as u32)
        else {
            panic!()
        };
        sb.notice(chunk, None).unwrap();
        assert_eq!(sb.manager_of(ra), None);
        // A notice claiming a chunk this endpoint manages is refused.
        let e = sb.notice((rb.0 / CHUNK_BYTES) as u32, Some(a)).unwrap_err();
        assert!(e.to_string().contains("is managed by endpoint 2"), "{e}");
    }
}
