//! Preprocesses every shader variant the engine can request and validates it with naga,
//! without a GPU, so a broken variant fails on any machine.

use flint_gpu::ops::all_variants;
use flint_gpu::shader::preprocess;
use flint_gpu::Caps;

fn validate(label: &str, source: &str, caps: &Caps) {
    let module = naga::front::wgsl::parse_str(source).unwrap_or_else(|e| panic!("{label}: {}", e.emit_to_string(source)));
    // pack2x16float / unpack2x16float (f16 KV caches) are core WGSL; wgpu grants naga this
    // capability on every backend but GLES without the half-float packing extension.
    let mut flags = naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32;
    if caps.shader_f16 {
        flags |= naga::valid::Capabilities::SHADER_FLOAT16;
    }
    if caps.subgroups {
        flags |= naga::valid::Capabilities::SUBGROUP;
    }
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), flags)
        .validate(&module)
        .unwrap_or_else(|e| panic!("{label}: {}", e.emit_to_string(source)));
}

#[test]
fn every_variant_preprocesses_and_validates() {
    let cap_sets = [
        Caps::default(),
        Caps { shader_f16: true, ..Default::default() },
        Caps { subgroups: true, subgroup_min_size: 32, ..Default::default() },
        Caps { shader_f16: true, subgroups: true, subgroup_min_size: 8, timestamps: true, cpu_like: true },
    ];
    let mut n = 0;
    let mut seen = std::collections::HashSet::new();
    for caps in &cap_sets {
        for key in all_variants(caps) {
            if !seen.insert(key.clone()) {
                continue;
            }
            let src = preprocess(key.shader, &key.defs).unwrap_or_else(|e| panic!("{}: {e}", key.label()));
            validate(&key.label(), &src, caps);
            n += 1;
        }
    }
    eprintln!("validated {n} shader variants");
}

#[test]
fn preprocessor_reports_bad_directives() {
    // Unknown files are typed errors, not panics.
    assert!(preprocess("no_such.wgsl", &Default::default()).is_err());
}
