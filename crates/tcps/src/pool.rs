//! The rings of connections, pooled: each accepted connection needs a
//! receive ring and a send ring (hundreds of KB together). Built fresh, every
//! accept zeroes and faults in that much memory and every close unmaps it
//! again (a TLB shootdown on every CPU of the process); under churn that was
//! the largest cost of a short connection (TS-7). The pool keeps the buffers
//! of closed connections' rings (up to `Config::ring_pool` of each kind) and
//! hands them to new ones with only their stamps reset.

use std::sync::Arc;

use sidecore_channel::ring::{BufferPool, Consumer, Producer, Ring, RingConfig, RingConfigError};

/// The two ring shapes of a server, each with its pool.
pub struct RingPool {
    rq: RingConfig,
    tx: RingConfig,
    rq_pool: Arc<BufferPool>,
    tx_pool: Arc<BufferPool>,
}

/// A connection's rings: receive (PPE → application), send (application → PPE).
pub struct ConnRings {
    pub rq: (Producer, Consumer),
    pub tx: (Producer, Consumer),
}

fn shape(slots: usize, slot_size: usize) -> RingConfig {
    RingConfig {
        slots,
        slot_size,
        consumers: 1,
        // The PPE publishes a whole batch of received messages at once
        // (`PConn::receive` calls publish), the application likewise.
        publish_batch: slots,
        release_batch: 1,
    }
}

impl RingPool {
    /// Pools for receive rings of `rq` = (slots, slot size) and send rings
    /// of `tx`, each keeping at most `keep` buffers; an error names the bad
    /// shape.
    pub fn new(
        rq: (usize, usize),
        tx: (usize, usize),
        keep: usize,
    ) -> Result<RingPool, RingConfigError> {
        let rq = shape(rq.0, rq.1);
        let tx = shape(tx.0, tx.1);
        Ok(RingPool {
            rq_pool: Arc::new(BufferPool::new(&rq, keep)?),
            tx_pool: Arc::new(BufferPool::new(&tx, keep)?),
            rq,
            tx,
        })
    }

    /// A fresh pair of rings for one connection.
    pub fn rings(&self) -> Result<ConnRings, RingConfigError> {
        let one = |cfg: RingConfig, pool: &Arc<BufferPool>| {
            let (p, mut cs) = Ring::create_pooled(cfg, pool)?;
            // `consumers: 1` gives exactly one consumer.
            let c = cs.pop().ok_or(RingConfigError::Consumers(0))?;
            Ok::<_, RingConfigError>((p, c))
        };
        Ok(ConnRings {
            rq: one(self.rq, &self.rq_pool)?,
            tx: one(self.tx, &self.tx_pool)?,
        })
    }

    /// (rings built on a kept buffer, rings that needed fresh memory), both kinds.
    pub fn counts(&self) -> (u64, u64) {
        let (a, b) = self.rq_pool.counts();
        let (c, d) = self.tx_pool.counts();
        (a + c, b + d)
    }
}
