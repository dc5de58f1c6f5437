// Package cuda is the CUDA driver API as kvxfer uses it: CUDA IPC handles
// (export, open, close), address ranges and device ordinals of device
// pointers, and device copies (cuMemcpyDtoD, cuMemcpyPeer, to and from host).
//
// The real driver (Open, Lazy) is libcuda.so.1 loaded with dlopen at run
// time, the way nixl/libnixl loads NIXL: building needs neither the CUDA
// toolkit nor a GPU, and a binary without a GPU starts; only the first call
// that needs the driver fails, with an error that says the process has no GPU
// access. Every call names a device and runs in that device's primary
// context, made current inside the same C call.
//
// Importer is the bookkeeping kvxferd does over a Driver: each distinct IPC
// handle is opened once (reference counted), checked against the device and
// the range it is registered with, and closed when its last user is gone.
// Everything that can go wrong (no GPU, wrong device, a stale handle, a range
// past the allocation) is refused by Importer.Open, so it never surfaces later
// as a failed write.
//
// Package cudafake is a small fake of the Driver entry points for tests of
// that bookkeeping and of the error paths; it is not what proves the GPU path
// works (scripts/gpu-check.sh on an NVIDIA machine does; see docs/vram.md).
package cuda
