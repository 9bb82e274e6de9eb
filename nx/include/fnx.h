! fnx.h: NX message passing (<nx.h>) for Fortran: include 'fnx.h'.
! Fixed and free source form alike. Link with -lvmmc_nx (gfortran's
! trailing underscore) or -lvmmc_nx_fortran_plain (-fno-underscoring).
! Arguments are default INTEGER (4 bytes), REAL, DOUBLE PRECISION or
! any buffer; info arrays hold 4 INTEGERs (type, count, node, ptype).
! Errors end the program, as NX's plain calls do (no _ forms).
      integer csendrecv, isend, irecv, irecvx, isendrecv
      integer msgdone, msgmerge, iprobe, iprobex
      integer infocount, infonode, infotype, infoptype, infopid
      integer hrecv, hrecvx, masktrap
      integer mynode, numnodes, myptype, mypid, myhost, mclock
      integer nodedim, gray, ginv, nx_app_rect, mypart
      integer nx_initve, nx_initve_rect, nx_nfork
      double precision dclock
      external csendrecv, isend, irecv, irecvx, isendrecv
      external msgdone, msgmerge, iprobe, iprobex
      external infocount, infonode, infotype, infoptype, infopid
      external hrecv, hrecvx, masktrap
      external mynode, numnodes, myptype, mypid, myhost, mclock
      external nodedim, gray, ginv, nx_app_rect, mypart
      external nx_initve, nx_initve_rect, nx_nfork, dclock
      integer FORCE_TYPE, INVALID_PTYPE
      parameter (FORCE_TYPE = 1073741824, INVALID_PTYPE = -1)
      integer NX_INFO_TYPE, NX_INFO_COUNT, NX_INFO_NODE, NX_INFO_PTYPE
      parameter (NX_INFO_TYPE = 1, NX_INFO_COUNT = 2)
      parameter (NX_INFO_NODE = 3, NX_INFO_PTYPE = 4)
      integer HWHZ
      parameter (HWHZ = 10000000)
