;; checksum: Internet checksum (RFC 1071) over the whole input buffer, emitted as 2 bytes.
;; The loop runs len/2 times: data-dependent, so its bound is declared (PACKET_LEN_MAX/2+1: the body starts once more to see the exit)
;; in the sidecore.bounds section and enforced by instrumentation.
(module
  (import "sc" "emit" (func $emit (param i32 i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (@custom "sidecore.bounds" "handle 0 PACKET_LEN_MAX/2+1")
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
)
