;; hostile: memory.grow bomb, a page per packet (and more in a bounded loop).
(module
  (memory (export "memory") 1)
  (func (export "sc_input_ptr") (result i32) (i32.const 4096))
  (func (export "sc_input_cap") (result i32) (i32.const 2048))
  (func (export "handle") (param $len i32) (result i32)
    (local $i i32)
    (loop $l
      (drop (memory.grow (i32.const 1024)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 64))))
    (memory.size))
)
