;; flowtable: per-flow packet and byte counters in an open-addressing hash table of 1024
;; slots in linear memory (region 'C), keyed by the IPv4 5-tuple. Probing is bounded to 8
;; slots (proven bound); a flow that finds no slot is counted as an overflow. Emits the
;; frame followed by nothing else; the flow's packet count is kept for the control plane.
;; `batch` does the same for up to 32 buffers per call and forwards each frame in place
;; (verdict fwd = 0): no host call per packet.
(module
  (import "sc" "emit" (func $emit (param i32 i32 i32) (result i32)))
  (memory (export "memory") 3 3)
  ;; slot s at 8192 + 32s: [src u32][dst u32][ports u32][proto u32][pkts u64][bytes u64]
  (global $overflow (mut i32) (i32.const 0))
  (func (export "sc_input_ptr") (result i32) (i32.const 4096))
  (func (export "sc_input_cap") (result i32) (i32.const 2048))
  (func (export "handle") (param $len i32) (result i32)
    (local $src i32) (local $dst i32) (local $ports i32) (local $proto i32)
    (local $h i32) (local $probe i32) (local $slot i32)
    (if (i32.lt_u (local.get $len) (i32.const 38)) (then (return (i32.const -1))))
    (local.set $proto (i32.load8_u (i32.const 4119)))
    (local.set $src (i32.load (i32.const 4122)))
    (local.set $dst (i32.load (i32.const 4126)))
    (local.set $ports (i32.load (i32.const 4130)))
    ;; multiplicative hash of the 5-tuple
    (local.set $h (i32.mul (i32.xor (i32.xor (local.get $src) (i32.rotl (local.get $dst) (i32.const 7)))
                                    (i32.xor (i32.rotl (local.get $ports) (i32.const 13)) (local.get $proto)))
                           (i32.const 0x9e3779b1)))
    (local.set $probe (i32.const 0))
    (block $done
      (loop $probe_loop
        (br_if $done (i32.ge_u (local.get $probe) (i32.const 8)))
        (local.set $slot (i32.add (i32.const 8192)
          (i32.shl (i32.and (i32.add (i32.shr_u (local.get $h) (i32.const 22)) (local.get $probe)) (i32.const 1023)) (i32.const 5))))
        ;; empty slot (pkts == 0): claim it
        (if (i64.eqz (i64.load offset=16 (local.get $slot)))
          (then
            (i32.store (local.get $slot) (local.get $src))
            (i32.store offset=4 (local.get $slot) (local.get $dst))
            (i32.store offset=8 (local.get $slot) (local.get $ports))
            (i32.store offset=12 (local.get $slot) (local.get $proto))))
        (if (i32.and (i32.and (i32.eq (i32.load (local.get $slot)) (local.get $src))
                              (i32.eq (i32.load offset=4 (local.get $slot)) (local.get $dst)))
                     (i32.and (i32.eq (i32.load offset=8 (local.get $slot)) (local.get $ports))
                              (i32.eq (i32.load offset=12 (local.get $slot)) (local.get $proto))))
          (then
            (i64.store offset=16 (local.get $slot) (i64.add (i64.load offset=16 (local.get $slot)) (i64.const 1)))
            (i64.store offset=24 (local.get $slot) (i64.add (i64.load offset=24 (local.get $slot)) (i64.extend_i32_u (local.get $len))))
            (return (call $emit (i32.const 0) (i32.const 4096) (local.get $len)))))
        (local.set $probe (i32.add (local.get $probe) (i32.const 1)))
        (br $probe_loop)))
    (global.set $overflow (i32.add (global.get $overflow) (i32.const 1)))
    (call $emit (i32.const 0) (i32.const 4096) (local.get $len)))
  ;; batch region at 65536: header (16), 32 descriptors (16 each), 32 slots of 2048
  (func (export "sc_batch_max") (result i32) (i32.const 32))
  (func (export "sc_batch_ptr") (result i32) (i32.const 65536))
  (func (export "batch") (param $n i32) (result i32)
    (local $k i32) (local $d i32) (local $p i32) (local $len i32)
    (local $src i32) (local $dst i32) (local $ports i32) (local $proto i32)
    (local $h i32) (local $probe i32) (local $slot i32)
    (local.set $k (i32.const 0))
    (block $done
      (loop $bufs
        (br_if $done (i32.ge_u (local.get $k) (local.get $n)))
        (local.set $d (i32.add (i32.const 65552) (i32.shl (local.get $k) (i32.const 4))))
        (local.set $p (i32.load (local.get $d)))
        (local.set $len (i32.load offset=4 (local.get $d)))
        (block $next
          (if (i32.lt_u (local.get $len) (i32.const 38))
            (then (i32.store offset=8 (local.get $d) (i32.const -1)) (br $next)))
          (local.set $proto (i32.load8_u offset=23 (local.get $p)))
          (local.set $src (i32.load offset=26 (local.get $p)))
          (local.set $dst (i32.load offset=30 (local.get $p)))
          (local.set $ports (i32.load offset=34 (local.get $p)))
          (local.set $h (i32.mul (i32.xor (i32.xor (local.get $src) (i32.rotl (local.get $dst) (i32.const 7)))
                                          (i32.xor (i32.rotl (local.get $ports) (i32.const 13)) (local.get $proto)))
                                 (i32.const 0x9e3779b1)))
          ;; every packet is forwarded to output 0, counted or not
          (i32.store offset=12 (local.get $d) (i32.const 0))
          (local.set $probe (i32.const 0))
          (block $probed
          (loop $probe_loop
            (br_if $probed (i32.ge_u (local.get $probe) (i32.const 8)))
            (local.set $slot (i32.add (i32.const 8192)
              (i32.shl (i32.and (i32.add (i32.shr_u (local.get $h) (i32.const 22)) (local.get $probe)) (i32.const 1023)) (i32.const 5))))
            (if (i64.eqz (i64.load offset=16 (local.get $slot)))
              (then
                (i32.store (local.get $slot) (local.get $src))
                (i32.store offset=4 (local.get $slot) (local.get $dst))
                (i32.store offset=8 (local.get $slot) (local.get $ports))
                (i32.store offset=12 (local.get $slot) (local.get $proto))))
            (if (i32.and (i32.and (i32.eq (i32.load (local.get $slot)) (local.get $src))
                                  (i32.eq (i32.load offset=4 (local.get $slot)) (local.get $dst)))
                         (i32.and (i32.eq (i32.load offset=8 (local.get $slot)) (local.get $ports))
                                  (i32.eq (i32.load offset=12 (local.get $slot)) (local.get $proto))))
              (then
                (i64.store offset=16 (local.get $slot) (i64.add (i64.load offset=16 (local.get $slot)) (i64.const 1)))
                (i64.store offset=24 (local.get $slot) (i64.add (i64.load offset=24 (local.get $slot)) (i64.extend_i32_u (local.get $len))))
                (br $next)))
            (local.set $probe (i32.add (local.get $probe) (i32.const 1)))
            (br $probe_loop)))
          ;; no slot for this flow
          (global.set $overflow (i32.add (global.get $overflow) (i32.const 1))))
        (local.set $k (i32.add (local.get $k) (i32.const 1)))
        (br $bufs)))
    (i32.const 0))
)
