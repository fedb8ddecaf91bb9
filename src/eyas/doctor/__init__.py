"""``eyas doctor``: is this draft going to be accepted (static), and is it being accepted (live)?"""
