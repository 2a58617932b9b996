;; hostile: mutual recursion (is_even / is_odd).
(module
  (memory (export "memory") 1 1)
  (func (export "sc_input_ptr") (result i32) (i32.const 4096))
  (func (export "sc_input_cap") (result i32) (i32.const 2048))
  (func $even (param $n i32) (result i32)
    (if (result i32) (i32.eqz (local.get $n)) (then (i32.const 1))
      (else (call $odd (i32.sub (local.get $n) (i32.const 1))))))
  (func $odd (param $n i32) (result i32)
    (if (result i32) (i32.eqz (local.get $n)) (then (i32.const 0))
      (else (call $even (i32.sub (local.get $n) (i32.const 1))))))
  (func (export "handle") (param $len i32) (result i32)
    (call $even (local.get $len)))
)
