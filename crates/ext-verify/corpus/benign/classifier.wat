;; classifier: first-match classifier over 16 rules (protocol, destination-port range)
;; held in linear memory; sends the frame to the output of the first rule that matches
;; (outputs 0-3), or to output 3 if none does. The rule loop's bound (16) is proven from
;; the bytecode: counter i from 0, step 1, exits when i >= 16. `batch` classifies up to
;; 32 buffers per call and forwards each in place to its output (verdict fwd = rule's
;; output): no host call per packet.
(module
  (import "sc" "emit" (func $emit (param i32 i32 i32) (result i32)))
  (memory (export "memory") 2 2)
  ;; rule r at 256 + 8r: [proto u8][out u8][pad u16][lo u16][hi u16]; 16 rules
  (data (i32.const 256)
    "\06\00\00\00\00\00\50\00"  ;; tcp dport 0..80      -> 0 (lo=0 hi=80)
    "\06\01\00\00\bb\01\bb\01"  ;; tcp dport 443        -> 1
    "\11\02\00\00\35\00\35\00"  ;; udp dport 53         -> 2
    "\11\02\00\00\7b\00\7b\00"  ;; udp dport 123        -> 2
    "\06\00\00\00\16\00\16\00"  ;; tcp 22 -> 0
    "\06\00\00\00\19\00\19\00"  ;; tcp 25 -> 0
    "\06\01\00\00\90\1f\90\1f"  ;; tcp 8080 -> 1
    "\11\02\00\00\a1\00\a2\00"  ;; udp 161-162 -> 2
    "\11\02\00\00\f4\01\f4\01"  ;; udp 500 -> 2
    "\06\01\00\00\e8\03\0f\27"  ;; tcp 1000-9999 -> 1
    "\11\02\00\00\e8\03\0f\27"  ;; udp 1000-9999 -> 2
    "\01\02\00\00\00\00\ff\ff"  ;; icmp any -> 2
    "\2f\01\00\00\00\00\ff\ff"  ;; gre any -> 1
    "\32\01\00\00\00\00\ff\ff"  ;; esp any -> 1
    "\84\02\00\00\00\00\ff\ff"  ;; sctp any -> 2
    "\29\02\00\00\00\00\ff\ff") ;; ipv6-in-ipv4 -> 2
  (func (export "sc_input_ptr") (result i32) (i32.const 4096))
  (func (export "sc_input_cap") (result i32) (i32.const 2048))
  (func $be16 (param $p i32) (result i32)
    (i32.or (i32.shl (i32.load8_u (local.get $p)) (i32.const 8)) (i32.load8_u offset=1 (local.get $p))))
  (func (export "handle") (param $len i32) (result i32)
    (local $proto i32) (local $dport i32) (local $i i32) (local $r i32) (local $out i32)
    (local.set $out (i32.const 3))
    (if (i32.lt_u (local.get $len) (i32.const 38)) (then (return (call $emit (i32.const 3) (i32.const 4096) (local.get $len)))))
    (if (i32.ne (call $be16 (i32.const 4108)) (i32.const 0x0800))
      (then (return (call $emit (i32.const 3) (i32.const 4096) (local.get $len)))))
    (local.set $proto (i32.load8_u (i32.const 4119)))
    ;; L4 header after IHL*4 bytes (IHL clamped to 5..15 by the mask)
    (local.set $dport (call $be16 (i32.add (i32.add (i32.const 4110)
        (i32.shl (i32.and (i32.load8_u (i32.const 4110)) (i32.const 15)) (i32.const 2))) (i32.const 2))))
    (local.set $i (i32.const 0))
    (block $found
      (loop $rules
        (br_if $found (i32.ge_u (local.get $i) (i32.const 16)))
        (local.set $r (i32.add (i32.const 256) (i32.shl (local.get $i) (i32.const 3))))
        (if (i32.and
              (i32.eq (i32.load8_u (local.get $r)) (local.get $proto))
              (i32.and
                (i32.ge_u (local.get $dport) (i32.load16_u offset=4 (local.get $r)))
                (i32.le_u (local.get $dport) (i32.load16_u offset=6 (local.get $r)))))
          (then (local.set $out (i32.load8_u offset=1 (local.get $r))) (br $found)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $rules)))
    (call $emit (local.get $out) (i32.const 4096) (local.get $len)))
  ;; batch region at 8192: header (16), 32 descriptors (16 each), 32 slots of 2048
  (func (export "sc_batch_max") (result i32) (i32.const 32))
  (func (export "sc_batch_ptr") (result i32) (i32.const 8192))
  (func (export "batch") (param $n i32) (result i32)
    (local $k i32) (local $d i32) (local $p i32) (local $proto i32) (local $dport i32)
    (local $i i32) (local $r i32) (local $out i32)
    (local.set $k (i32.const 0))
    (block $done
      (loop $bufs
        (br_if $done (i32.ge_u (local.get $k) (local.get $n)))
        (local.set $d (i32.add (i32.const 8208) (i32.shl (local.get $k) (i32.const 4))))
        (local.set $p (i32.load (local.get $d)))
        (local.set $out (i32.const 3))
        (block $classified
          (br_if $classified (i32.lt_u (i32.load offset=4 (local.get $d)) (i32.const 38)))
          (br_if $classified (i32.ne (call $be16 (i32.add (local.get $p) (i32.const 12))) (i32.const 0x0800)))
          (local.set $proto (i32.load8_u offset=23 (local.get $p)))
          (local.set $dport (call $be16 (i32.add (i32.add (local.get $p) (i32.const 14))
              (i32.add (i32.shl (i32.and (i32.load8_u offset=14 (local.get $p)) (i32.const 15)) (i32.const 2)) (i32.const 2)))))
          (local.set $i (i32.const 0))
          (loop $rules
            (br_if $classified (i32.ge_u (local.get $i) (i32.const 16)))
            (local.set $r (i32.add (i32.const 256) (i32.shl (local.get $i) (i32.const 3))))
            (if (i32.and
                  (i32.eq (i32.load8_u (local.get $r)) (local.get $proto))
                  (i32.and
                    (i32.ge_u (local.get $dport) (i32.load16_u offset=4 (local.get $r)))
                    (i32.le_u (local.get $dport) (i32.load16_u offset=6 (local.get $r)))))
              (then (local.set $out (i32.load8_u offset=1 (local.get $r))) (br $classified)))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br $rules)))
        (i32.store offset=12 (local.get $d) (local.get $out))
        (local.set $k (i32.add (local.get $k) (i32.const 1)))
        (br $bufs)))
    (i32.const 0))
)
