"""What a call's verdict is made from: the standards' verdict and the ordered ways a call
judged error is judged again (`judgement`), the arithmetic those read (`terms`: each
element's terms; `groups`: elements that share a rounded normaliser; `rounding`: kernels
that round once; `summed`: gradients summed over routes; `written_rows`: only what a
grouped kernel wrote), and the result as plain data that every later stage reads (`record`).

May import: no other feature of judge/ (it is their core).
"""
