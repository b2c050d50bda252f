// _native.InputArena: ArenaBlocks (input_arena.h) as the Python object ipc/tensor_pool.py's
// ArenaAllocator builds per arena in place of its Python _Arena (the frontend's input arenas:
// frontend/main.py's _input_arena). Python twin: tensor_pool._Arena, the same interface
// (segment, generation, try_alloc, live_blocks, unfreed_blocks).
#ifndef TRITON_MP_FRONTEND_NATIVE_INPUT_ARENA_TYPE_H_
#define TRITON_MP_FRONTEND_NATIVE_INPUT_ARENA_TYPE_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <memory>

#include "input_arena.h"

namespace triton_mp {

// Adds the InputArena type to the module (at its init). False: a Python error is set.
bool AddInputArenaType(PyObject* module);

// The ArenaBlocks of an _native.InputArena, with its segment's writable mapping exported
// into *view (at least header + capacity bytes; the caller releases it); nullptr with a
// Python error set (TypeError for any other object).
std::shared_ptr<ArenaBlocks> ArenaBlocksOf(PyObject* obj, Py_buffer* view);

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_INPUT_ARENA_TYPE_H_
