;; hostile: rewrites its table at run time, so call_indirect targets are unknowable.
(module
  (memory (export "memory") 1 1)
  (func (export "sc_input_ptr") (result i32) (i32.const 4096))
  (func (export "sc_input_cap") (result i32) (i32.const 2048))
  (type $t (func (param i32) (result i32)))
  (table 2 2 funcref)
  (elem declare func $g)
  (func $g (type $t) (param $n i32) (result i32) (local.get $n))
  (func (export "handle") (param $len i32) (result i32)
    (table.set (i32.const 1) (ref.func $g))
    (call_indirect (type $t) (local.get $len) (i32.const 1)))
)
