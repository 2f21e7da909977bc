//! `flint devices` (`flint --list-devices`): the GPU adapters wgpu finds, with the index and
//! name `--device` takes, and the limits that bound what each can hold.

use crate::Failure;

pub fn devices() -> Result<(), Failure> {
    let found = futures::executor::block_on(flint::gpu_adapters());
    if found.is_empty() {
        return Err(Failure::runtime("no GPU adapter found (on Linux, a Vulkan driver such as mesa-vulkan-drivers provides one)"));
    }
    let mib = |b: u64| format!("{} MiB", b >> 20);
    for a in &found {
        let l = &a.limits;
        println!("{}: {} ({:?}, {:?}), driver {} {}", a.index, a.info.name, a.info.device_type, a.info.backend, a.info.driver, a.info.driver_info);
        println!(
            "   max buffer {}, max storage binding {}, workgroup storage {} KiB, {} invocations per workgroup, {} storage buffers per stage",
            mib(l.max_buffer_size),
            mib(l.max_storage_buffer_binding_size),
            l.max_compute_workgroup_storage_size / 1024,
            l.max_compute_invocations_per_workgroup,
            l.max_storage_buffers_per_shader_stage
        );
        let subgroups = match a.subgroup_sizes {
            (0, _) => "none".to_string(),
            (lo, hi) if lo == hi => format!("{lo} lanes"),
            (lo, hi) => format!("{lo}-{hi} lanes"),
        };
        let matrices = if a.cooperative_matrices.is_empty() { "none".to_string() } else { a.cooperative_matrices.join(", ") };
        println!("   subgroups {subgroups}; cooperative matrices {matrices}");
    }
    Ok(())
}
