;; hdr_rewrite: NAT-style IPv4 header rewriter. For an Ethernet+IPv4 frame it replaces the
;; destination address with 10.0.0.1, decrements the TTL and patches the header checksum
;; incrementally (RFC 1624), then emits the frame. Non-IPv4 or short frames are dropped.
;; `batch` does the same to up to 32 buffers per call and forwards each rewritten frame
;; in place (verdict fwd = 0: no host call per packet); its helpers are inlined, as an
;; optimising compiler would. Its buffer loop is bounded by the batch size n ≤ B.
(module
  (import "sc" "emit" (func $emit (param i32 i32 i32) (result i32)))
  (memory (export "memory") 2 2)
  (func (export "sc_input_ptr") (result i32) (i32.const 4096))
  (func (export "sc_input_cap") (result i32) (i32.const 2048))
  ;; ones-complement add of two 16-bit values
  (func $csum_add (param $a i32) (param $b i32) (result i32)
    (local $s i32)
    (local.set $s (i32.add (local.get $a) (local.get $b)))
    (i32.and (i32.add (local.get $s) (i32.shr_u (local.get $s) (i32.const 16))) (i32.const 0xffff)))
  (func $be16 (param $p i32) (result i32)
    (i32.or (i32.shl (i32.load8_u (local.get $p)) (i32.const 8)) (i32.load8_u offset=1 (local.get $p))))
  (func (export "handle") (param $len i32) (result i32)
    (local $ip i32) (local $c i32) (local $old i32) (local $new i32)
    (if (i32.lt_u (local.get $len) (i32.const 34)) (then (return (i32.const -1))))
    ;; ethertype 0x0800
    (if (i32.ne (call $be16 (i32.const 4108)) (i32.const 0x0800)) (then (return (i32.const -1))))
    (local.set $ip (i32.const 4110))
    ;; TTL: word at ip+8 is (ttl<<8 | proto)
    (if (i32.le_u (i32.load8_u offset=8 (local.get $ip)) (i32.const 1)) (then (return (i32.const -2))))
    (local.set $old (call $be16 (i32.add (local.get $ip) (i32.const 8))))
    (i32.store8 offset=8 (local.get $ip) (i32.sub (i32.load8_u offset=8 (local.get $ip)) (i32.const 1)))
    (local.set $new (call $be16 (i32.add (local.get $ip) (i32.const 8))))
    ;; HC' = ~(~HC + ~m + m')
    (local.set $c (i32.xor (call $be16 (i32.add (local.get $ip) (i32.const 10))) (i32.const 0xffff)))
    (local.set $c (call $csum_add (local.get $c) (i32.xor (local.get $old) (i32.const 0xffff))))
    (local.set $c (call $csum_add (local.get $c) (local.get $new)))
    ;; destination address (two 16-bit words at ip+16, ip+18) -> 10.0.0.1
    (local.set $c (call $csum_add (local.get $c) (i32.xor (call $be16 (i32.add (local.get $ip) (i32.const 16))) (i32.const 0xffff))))
    (local.set $c (call $csum_add (local.get $c) (i32.xor (call $be16 (i32.add (local.get $ip) (i32.const 18))) (i32.const 0xffff))))
    (local.set $c (call $csum_add (local.get $c) (i32.const 0x0a00)))
    (local.set $c (call $csum_add (local.get $c) (i32.const 0x0001)))
    (i32.store offset=16 (local.get $ip) (i32.const 0x0100000a))
    (local.set $c (i32.xor (local.get $c) (i32.const 0xffff)))
    (i32.store8 offset=10 (local.get $ip) (i32.shr_u (local.get $c) (i32.const 8)))
    (i32.store8 offset=11 (local.get $ip) (local.get $c))
    (call $emit (i32.const 0) (i32.const 4096) (local.get $len)))
  ;; batch region at 8192: header (16), 32 descriptors (16 each), 32 slots of 2048
  (func (export "sc_batch_max") (result i32) (i32.const 32))
  (func (export "sc_batch_ptr") (result i32) (i32.const 8192))
  (func (export "batch") (param $n i32) (result i32)
    (local $i i32) (local $d i32) (local $p i32) (local $c i32) (local $s i32) (local $old i32)
    (local.set $i (i32.const 0))
    (block $done
      (loop $bufs
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        ;; descriptor i: [off][len][status][fwd]
        (local.set $d (i32.add (i32.const 8208) (i32.shl (local.get $i) (i32.const 4))))
        (local.set $p (i32.load (local.get $d)))
        (block $verdict
          (block $drop
            (br_if $drop (i32.lt_u (i32.load offset=4 (local.get $d)) (i32.const 34)))
            ;; ethertype 0x0800 (bytes 08 00, a little-endian u16 of 0x0008)
            (br_if $drop (i32.ne (i32.load16_u offset=12 (local.get $p)) (i32.const 0x0008)))
            (if (i32.le_u (i32.load8_u offset=22 (local.get $p)) (i32.const 1))
              (then (i32.store offset=8 (local.get $d) (i32.const -2)) (br $verdict)))
            ;; old TTL/proto word, big-endian
            (local.set $old (i32.or (i32.shl (i32.load8_u offset=22 (local.get $p)) (i32.const 8))
                                    (i32.load8_u offset=23 (local.get $p))))
            (i32.store8 offset=22 (local.get $p) (i32.sub (i32.load8_u offset=22 (local.get $p)) (i32.const 1)))
            ;; HC' = ~(~HC + ~m + m'), m' = m - 0x100
            (local.set $c (i32.xor (i32.or (i32.shl (i32.load8_u offset=24 (local.get $p)) (i32.const 8))
                                           (i32.load8_u offset=25 (local.get $p))) (i32.const 0xffff)))
            (local.set $s (i32.add (local.get $c) (i32.xor (local.get $old) (i32.const 0xffff))))
            (local.set $c (i32.and (i32.add (local.get $s) (i32.shr_u (local.get $s) (i32.const 16))) (i32.const 0xffff)))
            (local.set $s (i32.add (local.get $c) (i32.sub (local.get $old) (i32.const 0x100))))
            (local.set $c (i32.and (i32.add (local.get $s) (i32.shr_u (local.get $s) (i32.const 16))) (i32.const 0xffff)))
            ;; destination address words at ip+16, ip+18 -> 10.0.0.1
            (local.set $s (i32.add (local.get $c) (i32.xor (i32.or (i32.shl (i32.load8_u offset=30 (local.get $p)) (i32.const 8))
                                                                    (i32.load8_u offset=31 (local.get $p))) (i32.const 0xffff))))
            (local.set $c (i32.and (i32.add (local.get $s) (i32.shr_u (local.get $s) (i32.const 16))) (i32.const 0xffff)))
            (local.set $s (i32.add (local.get $c) (i32.xor (i32.or (i32.shl (i32.load8_u offset=32 (local.get $p)) (i32.const 8))
                                                                    (i32.load8_u offset=33 (local.get $p))) (i32.const 0xffff))))
            (local.set $c (i32.and (i32.add (local.get $s) (i32.shr_u (local.get $s) (i32.const 16))) (i32.const 0xffff)))
            (local.set $s (i32.add (local.get $c) (i32.const 0x0a00)))
            (local.set $c (i32.and (i32.add (local.get $s) (i32.shr_u (local.get $s) (i32.const 16))) (i32.const 0xffff)))
            (local.set $s (i32.add (local.get $c) (i32.const 0x0001)))
            (local.set $c (i32.and (i32.add (local.get $s) (i32.shr_u (local.get $s) (i32.const 16))) (i32.const 0xffff)))
            (i32.store offset=30 (local.get $p) (i32.const 0x0100000a))
            (local.set $c (i32.xor (local.get $c) (i32.const 0xffff)))
            (i32.store8 offset=24 (local.get $p) (i32.shr_u (local.get $c) (i32.const 8)))
            (i32.store8 offset=25 (local.get $p) (local.get $c))
            ;; verdict: forward the rewritten frame to output 0
            (i32.store offset=12 (local.get $d) (i32.const 0))
            (br $verdict))
          (i32.store offset=8 (local.get $d) (i32.const -1)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $bufs)))
    (i32.const 0))
)
