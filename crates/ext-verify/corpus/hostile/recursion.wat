;; hostile: self-recursion (factorial of the input length).
(module
  (memory (export "memory") 1 1)
  (func (export "sc_input_ptr") (result i32) (i32.const 4096))
  (func (export "sc_input_cap") (result i32) (i32.const 2048))
  (func $fact (param $n i32) (result i32)
    (if (result i32) (i32.le_u (local.get $n) (i32.const 1))
      (then (i32.const 1))
      (else (i32.mul (local.get $n) (call $fact (i32.sub (local.get $n) (i32.const 1)))))))
  (func (export "handle") (param $len i32) (result i32)
    (call $fact (local.get $len)))
)
