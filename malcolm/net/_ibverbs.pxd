# cython: language_level=3
"""The part of ``<infiniband/verbs.h>`` that malcolm's verbs data path uses, declared once.

Only the fields read or written are declared (Cython generates member accesses, never the
struct layouts). Cimported by :mod:`malcolm.net._ud_queue` and :mod:`malcolm.net._verbs`;
both link libibverbs (setup.py builds them only where its header is installed).
"""
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t

cdef extern from "infiniband/verbs.h" nogil:
    cdef struct ibv_context:
        pass
    cdef struct ibv_pd:
        ibv_context *context
    cdef struct ibv_comp_channel:
        ibv_context *context
        int fd
    cdef struct ibv_cq:
        ibv_context *context
        ibv_comp_channel *channel
        int cqe
    cdef struct ibv_ah:
        ibv_context *context
        ibv_pd *pd
    cdef enum ibv_qp_type:
        IBV_QPT_RC
        IBV_QPT_UD
    cdef struct ibv_qp:
        ibv_context *context
        ibv_pd *pd
        ibv_cq *send_cq
        ibv_cq *recv_cq
        uint32_t qp_num
        ibv_qp_type qp_type
    cdef struct ibv_sge:
        uint64_t addr
        uint32_t length
        uint32_t lkey
    cdef struct ibv_recv_wr:
        uint64_t wr_id
        ibv_recv_wr *next
        ibv_sge *sg_list
        int num_sge
    # The UD address lives in an anonymous union inside ibv_send_wr; only member access is
    # generated, so these helper type names never reach the C compiler.
    ctypedef struct _ibv_ud_fields:
        ibv_ah *ah
        uint32_t remote_qpn
        uint32_t remote_qkey
    ctypedef union _ibv_wr_union:
        _ibv_ud_fields ud
    cdef enum ibv_wr_opcode:
        IBV_WR_SEND
    cdef enum ibv_send_flags:
        IBV_SEND_SIGNALED
        IBV_SEND_INLINE
    cdef struct ibv_send_wr:
        uint64_t wr_id
        ibv_send_wr *next
        ibv_sge *sg_list
        int num_sge
        ibv_wr_opcode opcode
        unsigned int send_flags
        _ibv_wr_union wr
    cdef enum ibv_wc_status:
        IBV_WC_SUCCESS
    cdef enum ibv_wc_flags:
        IBV_WC_GRH
    cdef struct ibv_wc:
        uint64_t wr_id
        ibv_wc_status status
        uint32_t byte_len
        uint32_t qp_num
        uint32_t src_qp
        unsigned int wc_flags
    cdef union ibv_gid:
        uint8_t raw[16]
    cdef struct ibv_global_route:
        ibv_gid dgid
        uint32_t flow_label
        uint8_t sgid_index
        uint8_t hop_limit
        uint8_t traffic_class
    cdef struct ibv_ah_attr:
        ibv_global_route grh
        uint16_t dlid
        uint8_t sl
        uint8_t src_path_bits
        uint8_t static_rate
        uint8_t is_global
        uint8_t port_num
    ibv_ah *ibv_create_ah(ibv_pd *pd, ibv_ah_attr *attr)
    int ibv_destroy_ah(ibv_ah *ah)
    int ibv_req_notify_cq(ibv_cq *cq, int solicited_only)
    int ibv_get_cq_event(ibv_comp_channel *channel, ibv_cq **cq, void **cq_context)
    void ibv_ack_cq_events(ibv_cq *cq, unsigned int nevents)
    int ibv_poll_cq(ibv_cq *cq, int num_entries, ibv_wc *wc)
    int ibv_post_send(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad_wr)
    int ibv_post_recv(ibv_qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad_wr)
    const char *ibv_wc_status_str(ibv_wc_status status)
