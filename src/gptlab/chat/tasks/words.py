"""A hand-written list of common English words (3 to 8 lowercase letters) for the spelling and sorting tasks.

Written into the source so the tasks need no network and no corpus. Not here:
what the tasks do with the words (gptlab.chat.tasks.spelling, .sorting).
"""

WORDS: tuple[str, ...] = tuple(
    """
    able about above actor address adult after again agent agree ahead alarm album alive allergy allow alone along
    angel anger angle angry animal answer apple april arena argue arrive arrow artist aside asleep assess autumn avoid
    awake award baby back badge baker ball balloon band bank banner barrel basket bath battle beach bean bear beard
    beast bed bee begin bell belt bench berry bike bird birth black blade blank blind block blood bloom blue board
    boat body bone book boot border bottle bottom bowl brain branch brave bread break brick bride bridge bright bring
    broken brother brown brush bubble bucket build bunch burn bush butter button buzz cabin cable cake calm camel
    camera camp candle candy canoe cap captain car card care carpet carry cassette castle cat cause cave cellar chain
    chair chalk chance change cheap check cheese cherry chess chest chicken child choice circle city class classic
    clean clear clerk cliff climb clock close cloud coach coast coat coffee coin cold color comb cookie copper corn
    corner cotton couch count court cousin cover cow crab crane cream crew crowd crown cup curtain cycle daddy dance
    danger dark daughter dawn deer desert desk dessert dinner doctor dog doll dollar door dragon drama dream dress
    drink driver drum duck dust eagle early earth east egg elbow eleven empty engine enjoy enter equal error event
    excess farm father feather fellow fence fiddle field finger fire fish flag flame flower fly focus forest fork fox
    frame friend frog fruit garden gate gentle ghost giant gift giggle girl glass globe glove goat gold goose grammar
    grape grass green ground guest guitar hammer hand happy harbor hat heart hello hill hollow honey horse hotel house
    hunter ice idea island jacket jazz jelly jewel judge juice jungle kettle key king kitchen kite kitten knee knife
    ladder lake lamp laugh lemon letter light lion liquid little lizard llama lottery magic mammal market matter
    meadow meeting metal middle milk mirror mommy monkey moon morning mother motor mouse mouth music nail needle nest
    night noise noodle north number ocean office orange owl paint palace paper parrot party pencil pepper piano
    picture pilot pizza planet plant pocket poem potato puppy puzzle queen quiet rabbit radio rain referee river robot
    rocket rope rose rubber saddle salad salt sand school scissor sea seed shadow sheep sheet shell shelter ship shirt
    shoe shoot silver sister sky sleep sleeve snake sniff snow soap soccer song speech spell spider spoon spring staff
    star steel stone storm street stress stuff success sugar summer sun sweet table teeth tennis three tiger toast
    toffee tomato tomorrow tooth topping towel tower train tree trolley truck tunnel turtle uncle valley valve village
    violin wagon wallet water weekend whale wheel window winter wolf wood world yellow zebra zipper
    """.split()
)
