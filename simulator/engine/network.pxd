# Cython declarations that augment network.py (the one source) when setup.py compiles it as
# simulator/engine/_compiled_network: typed fields and locals of the hot paths; pure Python ignores this file.
cimport cython

cdef class _Flow:
    cdef public object demands
    cdef public object done
    cdef public double heaviest
    cdef public double remaining
    cdef public double rate
    cdef public object weights
    cdef public double solo_rate
    cdef public object factor
    cdef public object then

cdef class FlowNetwork:
    cdef public object clock
    cdef public object _queue, _now_queue, _sequence
    cdef public object _port_capacity
    cdef public dict _capacities, _flows_on_port
    cdef public set _shared_ports
    cdef public list _flows
    cdef public Py_ssize_t _factored
    cdef public double _last_update
    cdef public Py_ssize_t _version
    cdef public Py_ssize_t flows_started
    cdef public dict _prepared
    @cython.locals(flows=list, flow=_Flow, other=_Flow, now=double, elapsed=double, flows_on_port=dict, n=Py_ssize_t)
    cpdef _start(self, args)
    @cython.locals(flows=list, flow=_Flow, rate=double, left=double, until_s=double, next_s=double)
    cpdef _reallocate(self)
    @cython.locals(flows=list, flow=_Flow, now=double, elapsed=double, flows_on_port=dict, n=Py_ssize_t, finished=list)
    cpdef _on_timer(self, version)
    cpdef transfer_then(self, demands, latency_s, then)
