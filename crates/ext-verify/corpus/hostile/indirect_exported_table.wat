;; hostile: exports its table, so the embedder side could install any function.
(module
  (memory (export "memory") 1 1)
  (func (export "sc_input_ptr") (result i32) (i32.const 4096))
  (func (export "sc_input_cap") (result i32) (i32.const 2048))
  (type $t (func (param i32) (result i32)))
  (table (export "tbl") 1 1 funcref)
  (elem (i32.const 0) $g)
  (func $g (type $t) (param $n i32) (result i32) (local.get $n))
  (func (export "handle") (param $len i32) (result i32)
    (call_indirect (type $t) (local.get $len) (i32.const 0)))
)
