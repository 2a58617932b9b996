;; checksum: Internet checksum (RFC 1071) over the whole input buffer, emitted as 2 bytes.
;; The loop runs len/2 times: data-dependent, so its bound is declared (PACKET_LEN_MAX/2+1: the body starts once more to see the exit)
;; in the sidecore.bounds section and enforced by instrumentation.
;; `batch` checksums up to 32 buffers per call and forwards each checksum in place: the
;; two bytes are written over the start of the buffer's slot and the verdict is
;; (fwd = 0, len = 2), so no host call per packet. Its buffer loop is bounded by the batch
;; size; its inner (data-dependent) loop is declared like `handle`'s.
(module
  (import "sc" "emit" (func $emit (param i32 i32 i32) (result i32)))
  (memory (export "memory") 2 2)
  (@custom "sidecore.bounds" "handle 0 PACKET_LEN_MAX/2+1\nbatch 1 PACKET_LEN_MAX/2+1")
  (func (export "sc_input_ptr") (result i32) (i32.const 4096))
  (func (export "sc_input_cap") (result i32) (i32.const 2048))
  (func (export "handle") (param $len i32) (result i32)
    (local $p i32) (local $end i32) (local $sum i32)
    (local.set $p (i32.const 4096))
    (local.set $end (i32.add (i32.const 4096) (i32.and (local.get $len) (i32.const -2))))
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $p) (local.get $end)))
        (local.set $sum (i32.add (local.get $sum) (i32.load16_u (local.get $p))))
        (local.set $p (i32.add (local.get $p) (i32.const 2)))
        (br $l)))
    ;; odd trailing byte
    (if (i32.and (local.get $len) (i32.const 1))
      (then (local.set $sum (i32.add (local.get $sum) (i32.load8_u (local.get $end))))))
    (local.set $sum (i32.add (i32.and (local.get $sum) (i32.const 0xffff)) (i32.shr_u (local.get $sum) (i32.const 16))))
    (local.set $sum (i32.add (i32.and (local.get $sum) (i32.const 0xffff)) (i32.shr_u (local.get $sum) (i32.const 16))))
    (i32.store16 (i32.const 64) (i32.xor (local.get $sum) (i32.const 0xffff)))
    (call $emit (i32.const 0) (i32.const 64) (i32.const 2)))
  ;; batch region at 8192: header (16), 32 descriptors (16 each), 32 slots of 2048
  (func (export "sc_batch_max") (result i32) (i32.const 32))
  (func (export "sc_batch_ptr") (result i32) (i32.const 8192))
  (func (export "batch") (param $n i32) (result i32)
    (local $k i32) (local $d i32) (local $len i32) (local $p i32) (local $end i32) (local $sum i32)
    (local.set $k (i32.const 0))
    (block $done
      (loop $bufs
        (br_if $done (i32.ge_u (local.get $k) (local.get $n)))
        (local.set $d (i32.add (i32.const 8208) (i32.shl (local.get $k) (i32.const 4))))
        (local.set $len (i32.load offset=4 (local.get $d)))
        (local.set $p (i32.load (local.get $d)))
        (local.set $end (i32.add (local.get $p) (i32.and (local.get $len) (i32.const -2))))
        (local.set $sum (i32.const 0))
        (block $summed
          (loop $l
            (br_if $summed (i32.ge_u (local.get $p) (local.get $end)))
            (local.set $sum (i32.add (local.get $sum) (i32.load16_u (local.get $p))))
            (local.set $p (i32.add (local.get $p) (i32.const 2)))
            (br $l)))
        (if (i32.and (local.get $len) (i32.const 1))
          (then (local.set $sum (i32.add (local.get $sum) (i32.load8_u (local.get $end))))))
        (local.set $sum (i32.add (i32.and (local.get $sum) (i32.const 0xffff)) (i32.shr_u (local.get $sum) (i32.const 16))))
        (local.set $sum (i32.add (i32.and (local.get $sum) (i32.const 0xffff)) (i32.shr_u (local.get $sum) (i32.const 16))))
        ;; verdict: the 2-byte checksum, in place at the start of the slot, to output 0
        (i32.store16 (i32.load (local.get $d)) (i32.xor (local.get $sum) (i32.const 0xffff)))
        (i32.store offset=4 (local.get $d) (i32.const 2))
        (i32.store offset=12 (local.get $d) (i32.const 0))
        (local.set $k (i32.add (local.get $k) (i32.const 1)))
        (br $bufs)))
    (i32.const 0))
)
