;; hostile: imports a function outside sidecore's host ABI.
(module
  (import "env" "system" (func $system (param i32) (result i32)))
  (memory (export "memory") 1 1)
  (func (export "sc_input_ptr") (result i32) (i32.const 4096))
  (func (export "sc_input_cap") (result i32) (i32.const 2048))
  (func (export "handle") (param $len i32) (result i32)
    (call $system (i32.const 0)))
)
