# Cython declarations that augment engine.py (the one source) when setup.py compiles it as
# simulator/engine/_compiled_engine: the classes become extension types with typed fields and the
# hot methods get typed locals. Nothing here changes what the code does; pure Python ignores this file.
# Every Task field must be declared (an extension type has fixed fields, as the slotted dataclass does).
cimport cython

cdef class _Event:
    cdef public list callbacks
    cdef public bint triggered

cdef class Task:
    cdef public object name, actor, stream, category
    cdef public double duration_s
    cdef public object demands
    cdef public double latency_s
    cdef public double propagation_s
    cdef public object deps
    cdef public object rendezvous
    cdef public object rendezvous_size
    cdef public object segments, info, parts
    cdef public double slowdown_while_contended
    cdef public bint contends
    cdef public double comm_slowdown_while_computing
    cdef public bint slows_comm
    cdef public object shares, priority
    cdef public double interferes
    cdef public object run_spans
    cdef public double alloc_bytes, free_bytes
    cdef public object counter
    cdef public double start_s, end_s, ready_s
    cdef public object done
    cdef public list callbacks
    cdef public bint triggered

cdef class _Stream:
    cdef public Engine engine
    cdef public list tasks
    cdef public Py_ssize_t i
    cdef public object meeting
    cdef public object on_deps, on_compute, on_wait
    @cython.locals(task=Task, engine=Engine, i=Py_ssize_t, tasks=list, deps=list, propagation=double, now=double,
                   key=tuple, counters=dict)
    cpdef after_compute(self, _event)
    @cython.locals(task=Task, engine=Engine, propagation=double, now=double)
    cpdef after_wait(self, _event)

cdef class _AllOf:
    cdef public Engine engine
    cdef public Py_ssize_t left
    cdef public object then
    @cython.locals(engine=Engine)
    cpdef check(self, _event)

cdef class _Rendezvous:
    cdef public object size, arrived, all_arrived, finished

cdef class Engine:
    cdef public bint _keep_series
    cdef public double now
    cdef public list _queue
    cdef public object _now_queue
    cdef public object _sequence
    cdef public object network
    cdef public dict _rendezvous
    cdef public object _contending, _contention_changed, _computing, _slowed_flows, _compute_changed
    cdef public object _executors, _executor_changed
    cdef public dict counters, counter_peaks, counter_series
    @cython.locals(queue=list, fn=object, arg=object, callbacks=list)
    cpdef _loop(self)
    @cython.locals(tasks=list, n=Py_ssize_t, i=Py_ssize_t, queue=list, task=Task, deps=list, callbacks=list,
                   duration=double, end=double, now=double, key=tuple, counters=dict)
    cpdef _go(self, _Stream run, bint ready=*, _event=*)
    @cython.locals(propagation=double, now=double)
    cpdef _end(self, Task task)
    @cython.locals(counters=dict, peaks=dict)
    cpdef _count(self, key, delta)
    cpdef succeed(self, event)
