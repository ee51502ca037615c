"""A hand-written list of common English words (3 to 8 lowercase letters) for the spelling and sorting tasks.

Written into the source so the tasks need no network and no corpus. Not here:
what the tasks do with the words (gptlab.chat.tasks.spelling, .sorting).
"""

WORDS: tuple[str, ...] = tuple(
    """
    able about above actor adult after again agent agree ahead alarm album alive allow alone along angel anger
    angle angry animal answer apple april arena argue arrow artist aside asleep autumn avoid awake award
    baby back badge baker ball band bank basket bath beach bean bear beard beast bed bee begin bell belt bench
    berry bike bird birth black blade blank blind block blood bloom blue board boat body bone book boot border
    bottle bottom bowl brain branch brave bread break brick bride bridge bright bring broken brother brown
    brush bucket build bunch burn bush butter button cabin cable cake calm camel camera camp candle candy cap
    captain car card care carpet carry castle cat cause cave chain chair chalk chance change cheap check cheese
    cherry chess chest chicken child choice circle city class clean clear clerk cliff climb clock close cloud
    coach coast coat coffee coin cold color comb corn corner cotton couch count court cousin cover cow crab
    crane cream crew crowd crown cup curtain cycle dance danger dark daughter dawn deer desert desk dinner
    doctor dog doll dollar door dragon drama dream dress drink driver drum duck dust eagle early earth east
    egg elbow empty engine enjoy enter equal error event farm father feather fence field finger fire fish
    flag flame flower fly focus forest fork fox frame friend frog fruit garden gate gentle ghost giant gift
    girl glass globe glove goat gold grape grass green ground guest guitar hammer hand happy harbor hat heart
    hello hill honey horse hotel house hunter ice idea island jacket jelly jewel judge juice jungle kettle
    key king kitchen kite knee knife ladder lake lamp laugh lemon letter light lion liquid little lizard
    magic market meadow metal milk mirror monkey moon morning mother motor mouse mouth music nail needle
    nest night noise north number ocean office orange owl paint palace paper parrot party pencil pepper
    piano picture pilot planet plant pocket poem potato queen quiet rabbit radio rain river robot rocket
    rope rose salad salt sand school sea seed shadow sheep shell ship shirt shoe silver sister sky snake
    snow soap song spider spoon spring star stone storm street sugar summer sun table tiger toast tomato
    tooth towel tower train tree truck turtle uncle valley violin wagon water whale wheel window winter
    wolf wood world yellow zebra
    """.split()
)
