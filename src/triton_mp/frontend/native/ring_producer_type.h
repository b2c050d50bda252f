// _native.RingProducer (ring_producer_type.cc): the Python binding of RingProducer
// (ring_producer.h). Python twin: ipc/memory/ring.py Ring.push; its user:
// frontend/native/shared_ring.py (SharedRing, the frontend's ring to the scheduler).
#ifndef TRITON_MP_FRONTEND_NATIVE_RING_PRODUCER_TYPE_H_
#define TRITON_MP_FRONTEND_NATIVE_RING_PRODUCER_TYPE_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <memory>

#include "ring_producer.h"

namespace triton_mp {

// Adds the RingProducer type to the module (at its init). False: a Python error is set.
bool AddRingProducerType(PyObject* module);

// The RingProducer of an _native.RingProducer; nullptr (TypeError set) for any other object.
std::shared_ptr<RingProducer> RingProducerOf(PyObject* obj);

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_RING_PRODUCER_TYPE_H_
