;; hostile: recursion hidden behind call_indirect (the table holds the caller itself).
(module
  (memory (export "memory") 1 1)
  (func (export "sc_input_ptr") (result i32) (i32.const 4096))
  (func (export "sc_input_cap") (result i32) (i32.const 2048))
  (type $t (func (param i32) (result i32)))
  (table 1 1 funcref)
  (elem (i32.const 0) $f)
  (func $f (type $t) (param $n i32) (result i32)
    (call_indirect (type $t) (local.get $n) (i32.const 0)))
  (func (export "handle") (param $len i32) (result i32)
    (call $f (local.get $len)))
)
