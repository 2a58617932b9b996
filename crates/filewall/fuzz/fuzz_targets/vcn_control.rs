//! Fuzzes the Virtual Control Namespace's control-file parsers (what clients
//! WRITE to `roles/ctrl`, `users/ctrl` and shadow files) and the RBAC policy
//! file reader. Parsing must never panic; a shadow write that parses must apply,
//! render and parse back to the same matrix.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecore_filewall::rbac::Matrix;
use sidecore_filewall::rbac_file::parse_rbac;
use sidecore_filewall::vcn_text::{
    apply_edits, parse_admin_commands, parse_matrix_edits, parse_roles_request, render_matrix,
};

const ROLES: [&str; 4] = ["user", "developer", "admin", "threat"];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = parse_roles_request(text);
    let _ = parse_admin_commands(text);
    let _ = parse_rbac(text, "fuzz.toml");
    let roles = |n: &str| ROLES.iter().position(|r| *r == n);
    let name = |r: usize| ROLES[r].to_string();
    if let Ok(edits) = parse_matrix_edits(text, &roles) {
        let mut m = Matrix::default();
        apply_edits(&mut m, &Matrix::default(), &edits);
        let rendered = render_matrix(&m, &name);
        let mut again = Matrix::default();
        if !rendered.is_empty() {
            let back = parse_matrix_edits(&rendered, &roles).expect("a rendered matrix parses");
            apply_edits(&mut again, &Matrix::default(), &back);
        }
        assert_eq!(again, m, "render and parse round-trip");
    }
});
